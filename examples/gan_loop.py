"""A GAN in your own loop: two models, two losses, two optimizers on one Precision.

    python examples/gan_loop.py [--precision 16-mixed] [--steps 1500] [--separate-loss-scales]

The data are 8 Gaussians on a ring (2-D points). The generator G maps noise to points;
the discriminator D tells real points from G's. Each iteration is PyTorch's recipe for
several models, losses and optimizers, with amptrain's precision layer in the `prec.` lines:

    prec.backward(d_loss, loss_id=0); prec.step_async(opt_d)    # D's loss, D's step
    prec.backward(g_loss, loss_id=1); prec.step_async(opt_g)    # G's loss, G's step
    prec.update()                                               # the loss scale, once

Each optimizer skips its own step when its gradients hold inf/NaN. It prints the losses,
the loss scale(s), the skipped steps per optimizer and two quality numbers: how far G's
points lie from the nearest ring mode (falls as G learns) and how many of the 8 modes G
covers.
"""
from __future__ import annotations

import argparse
import math

import torch
from torch import nn
from torch.nn import functional as F

from amptrain import Precision

MODES = 8
RADIUS, SPREAD = 2.0, 0.05
NOISE = 8


def centres() -> torch.Tensor:
    angles = torch.arange(MODES) * (2 * math.pi / MODES)
    return RADIUS * torch.stack([angles.cos(), angles.sin()], dim=1)


def real_points(n: int, generator: torch.Generator) -> torch.Tensor:
    pick = torch.randint(MODES, (n,), generator=generator)
    return centres()[pick] + SPREAD * torch.randn(n, 2, generator=generator)


def mlp(inputs: int, outputs: int) -> nn.Module:
    return nn.Sequential(nn.Linear(inputs, 64), nn.LeakyReLU(0.2), nn.Linear(64, 64),
                         nn.LeakyReLU(0.2), nn.Linear(64, outputs))


@torch.no_grad()
def quality(generator: nn.Module, noise: torch.Tensor) -> tuple[float, int]:
    """(mean distance of G's points to the nearest mode centre, modes holding >= 1/4 of
    their fair share of G's points within 4 spreads of the centre)."""
    points = generator(noise).float()
    distance, nearest = torch.cdist(points, centres()).min(dim=1)
    close = nearest[distance < 4 * SPREAD]
    share = torch.bincount(close, minlength=MODES).float() / len(points)
    return distance.mean().item(), int((share >= 0.25 / MODES).sum())


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="16-mixed")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--separate-loss-scales", action="store_true",
                        help="one loss scale per loss (D's overflow does not shrink G's)")
    parser.add_argument("--print-every", type=int, default=0, help="default: steps / 10")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    data = torch.Generator().manual_seed(1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    G, D = mlp(NOISE, 2).to(device), mlp(2, 1).to(device)
    opt_g = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.999))

    prec = Precision(args.precision, device=device, init_scale=2.0 ** 12,
                     separate_loss_scales=args.separate_loss_scales)
    D, opt_d = prec.setup(D, opt_d)     # one setup per model and optimizer
    G, opt_g = prec.setup(G, opt_g)
    fixed_noise = torch.randn(2000, NOISE, device=device)
    every = args.print_every or max(1, args.steps // 10)
    first = quality(G, fixed_noise)
    print(f"{prec.name}: G's points start {first[0]:.3f} from the nearest mode, "
          f"covering {first[1]}/{MODES} modes")
    for step in range(1, args.steps + 1):
        real = real_points(args.batch_size, data).to(device)
        z = torch.randn(args.batch_size, NOISE, device=device)
        opt_d.zero_grad(set_to_none=True)   # G's loss below leaves gradients on D too
        opt_g.zero_grad(set_to_none=True)

        with prec.autocast():
            fake = G(z)
            d_loss = F.softplus(-D(real)).mean() + F.softplus(D(fake.detach())).mean()
        prec.backward(d_loss, loss_id=0)
        d_step = prec.step_async(opt_d)     # D alone skips if its gradients overflow

        with prec.autocast():
            g_loss = F.softplus(-D(fake)).mean()   # the non-saturating generator loss
        prec.backward(g_loss, loss_id=1)
        g_step = prec.step_async(opt_g)
        prec.update()                       # one loss-scale update per iteration
        prec.confirm(d_step, step)          # counts skips (reads the flags; the Trainer
        prec.confirm(g_step, step)          # reads them one step late instead)

        if step % every == 0 or step == args.steps:
            distance, covered = quality(G, fixed_noise)
            scales = ", ".join(f"{s:g}" for s in prec.loss_scales().values()) or "none"
            print(f"step {step:5d}  d_loss {d_loss.item():.3f}  g_loss {g_loss.item():.3f}  "
                  f"loss scale {scales}  skipped D {prec.skipped_steps_of(opt_d)} "
                  f"G {prec.skipped_steps_of(opt_g)}  distance to modes {distance:.3f}  "
                  f"modes {covered}/{MODES}")
    distance, covered = quality(G, fixed_noise)
    return {"first_distance": first[0], "distance": distance, "modes": covered}


if __name__ == "__main__":
    main()
