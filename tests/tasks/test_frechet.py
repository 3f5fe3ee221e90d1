"""tasks/frechet.py: the feature network of the GAN's val_fd says before it trains."""
from __future__ import annotations

import logging

import pytest
import torch

from amptrain.data import TensorData
from amptrain.common.errors import UserError
from amptrain.tasks import frechet


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_training_the_feature_network_is_announced_in_one_line(monkeypatch):
    monkeypatch.setattr(frechet, "FEATURE_STEPS", 2)  # the line, not the training, is tested
    g = torch.Generator().manual_seed(0)
    real = frechet.RealImages(TensorData(torch.rand(40, 1, 8, 8, generator=g),
                                         torch.arange(40) % 4))
    lines = Lines()
    logger = logging.getLogger("amptrain")
    logger.addHandler(lines)
    # setLevel, not an assignment to .level: it clears the logger's isEnabledFor cache, which
    # an earlier test in this process may have filled with INFO -> False
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        net, trained = frechet.train_feature_net(real, torch.device("cpu"))
    finally:
        logger.removeHandler(lines)
        logger.setLevel(previous)
    assert trained and not net.training
    assert lines.lines == ["val_fd: first training its feature network (a small CNN, 2 steps "
                           "on 40 real training images; once per run)"]


# --------------------------------------------------- the distance and its statistics
def test_the_distance_of_two_diagonal_gaussians_has_its_closed_form():
    mu1, mu2 = torch.tensor([0.0, 1.0, 2.0]), torch.tensor([1.0, 1.0, 0.0])
    a, b = torch.tensor([1.0, 4.0, 9.0]), torch.tensor([4.0, 1.0, 9.0])
    # |mu1 - mu2|^2 + sum (sqrt a - sqrt b)^2 = 5 + (1 + 1 + 0)
    fd = frechet.frechet_distance(mu1, torch.diag(a), mu2, torch.diag(b))
    assert abs(fd - 7.0) < 1e-9


def test_the_distance_of_a_distribution_to_itself_is_zero_and_it_is_symmetric():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(200, 5, generator=g), 2 * torch.randn(300, 5, generator=g) + 1
    mx, cx, my, cy = x.mean(0), torch.cov(x.T), y.mean(0), torch.cov(y.T)
    assert abs(frechet.frechet_distance(mx, cx, mx, cx)) < 1e-9
    forward, backward = frechet.frechet_distance(mx, cx, my, cy), \
        frechet.frechet_distance(my, cy, mx, cx)
    assert forward > 1.0 and abs(forward - backward) < 1e-9


def test_feature_sums_give_the_mean_and_unbiased_covariance_also_over_processes():
    g = torch.Generator().manual_seed(2)
    feats = torch.randn(50, 3, generator=g)
    whole = frechet.FeatureSums(3, torch.device("cpu"))
    whole.add(feats)
    count, mean, cov = frechet.FeatureSums.statistics(whole.flat(), 3)
    assert count == 50
    assert torch.allclose(mean, feats.double().mean(0))
    assert torch.allclose(cov, torch.cov(feats.double().T))
    # Two processes' sums (concatenated as a gather gives them) are the whole's.
    parts = [frechet.FeatureSums(3, torch.device("cpu")) for _ in range(2)]
    parts[0].add(feats[:20])
    parts[1].add(feats[20:])
    joined = frechet.FeatureSums.statistics(torch.cat([p.flat() for p in parts]), 3)
    assert joined[0] == 50 and torch.allclose(joined[1], mean) and torch.allclose(joined[2], cov)


# --------------------------------------------------- the real images
def test_images_of_a_batch_and_a_batch_without_images():
    images = torch.zeros(2, 1, 4, 4)
    assert frechet.images_of((images, torch.zeros(2))) is images
    assert frechet.images_of(images) is images
    with pytest.raises(UserError, match=r"batches of images .* holds of shape \(2, 16\)"):
        frechet.images_of(torch.zeros(2, 16))


def test_the_real_sample_is_seeded_and_keeps_only_class_labels():
    g = torch.Generator().manual_seed(3)
    x = torch.rand(30, 3, 4, 4, generator=g)
    one = frechet.RealImages(TensorData(x, torch.arange(30) % 3))
    two = frechet.RealImages(TensorData(x, torch.arange(30) % 3))
    assert torch.equal(one.x, two.x) and len(one) == 30 and one.classes == 3
    floats = frechet.RealImages(TensorData(x, torch.rand(30, generator=g)))
    assert floats.y is None and floats.classes == 0  # regression targets are no classes
    single = frechet.RealImages(TensorData(x, torch.zeros(30, dtype=torch.long)))
    assert single.classes == 0  # one class cannot train a classifier


def test_images_that_are_neither_grey_nor_rgb_are_refused():
    with pytest.raises(UserError, match="grey or RGB images"):
        frechet.RealImages(TensorData(torch.rand(8, 2, 4, 4), torch.arange(8) % 2))


def test_training_the_feature_network_leaves_the_global_rng_alone(monkeypatch):
    monkeypatch.setattr(frechet, "FEATURE_STEPS", 2)
    g = torch.Generator().manual_seed(4)
    real = frechet.RealImages(TensorData(torch.rand(16, 1, 8, 8, generator=g),
                                         torch.arange(16) % 2))
    torch.manual_seed(123)
    before = torch.get_rng_state()
    net, trained = frechet.train_feature_net(real, torch.device("cpu"))
    assert trained and torch.equal(torch.get_rng_state(), before)
    again, _ = frechet.train_feature_net(real, torch.device("cpu"))
    images = torch.rand(3, 1, 8, 8, generator=g)
    feats = frechet.features(net, images)
    assert feats.shape == (3, 4 * frechet.FEATURE_WIDTH)
    assert torch.equal(feats, frechet.features(again, images))  # seeded: the same network
