"""``amptrain generate``: continue a prompt with a trained language model, or draw images
from a trained GAN (``--samples N --out DIR``)."""
from __future__ import annotations

import argparse
import sys

HELP = "continue a text with a trained language model, or draw images from a GAN"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The checkpoint, the prompt and how tokens are drawn."""
    parser.add_argument("--checkpoint", required=True,
                        help="checkpoint of a language-model or GAN run (a file, or the run "
                             "directory)")
    parser.add_argument("--prompt", default="", help="text to continue (default: a new line)")
    parser.add_argument("--tokens", type=int, default=200, help="tokens to generate (default: 200)")
    parser.add_argument("--temperature", type=float, default=0.8,
                        help="sampling temperature; 0 takes the most likely token (default: 0.8)")
    parser.add_argument("--top-k", type=int, default=None,
                        help="sample among the K most likely tokens only")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    parser.add_argument("--samples", type=int, default=None,
                        help="GAN checkpoints: draw this many images (PNG files in --out)")
    parser.add_argument("--out", default=None,
                        help="GAN checkpoints: the directory for the images and grid.png")
    parser.add_argument("--precision", default="auto", help="precision (default: auto)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")


def run(args: argparse.Namespace) -> int:
    """Print the prompt and its continuation, or write a GAN's images."""
    # deferred: torch loads when the command runs, not for --help
    from ..workflows.generate import Sampling, check_image_request, generate_images, generate_text

    check_image_request(args.samples, args.out, args.seed)  # before the checkpoint is read
    if args.samples is not None:
        files = generate_images(args.checkpoint, args.samples, args.out, seed=args.seed,
                                device=args.device, precision=args.precision)
        sys.stdout.write(f"wrote {len(files) - 1} images and {files[-1].name} to {args.out}\n")
        return 0

    # The sampling options are checked before the checkpoint is read.
    sampling = Sampling(tokens=args.tokens, temperature=args.temperature, top_k=args.top_k,
                        seed=args.seed)
    text = generate_text(args.checkpoint, args.prompt, sampling, device=args.device,
                         precision=args.precision)
    sys.stdout.write(args.prompt + text + "\n")
    return 0
