"""The image classifier example (``warpdeck.examples.classify``): its image generator, its model
and its torch stage, called directly (the end-to-end run is in test_examples_run.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")

from warpdeck.examples import classify  # noqa: E402 - needs torch, skipped above without it

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"


def test_make_images_writes_count_files_of_every_mode_and_format(tmp_path: Path) -> None:
    paths = classify.make_images(tmp_path, 10, sizes=(20, 40))
    assert sorted(p.name for p in tmp_path.iterdir()) == [p.name for p in paths]
    seen = set()
    for p in paths:
        with Image.open(p) as img:
            assert 20 <= img.width <= 40 and 20 <= img.height <= 40
            seen.add((img.mode, img.format))
    assert seen == {("RGB", "PNG"), ("RGB", "JPEG"), ("L", "PNG"), ("RGBA", "PNG"), ("L", "JPEG")}


def test_make_images_is_reproducible_per_seed(tmp_path: Path) -> None:
    a, b, c = (classify.make_images(tmp_path / name, 3, seed=s) for name, s in (("a", 1), ("b", 1), ("c", 2)))
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert [p.read_bytes() for p in a] != [p.read_bytes() for p in c]


def test_make_model_is_the_same_every_time_and_in_eval_mode() -> None:
    one, two = classify.make_model(), classify.make_model()
    assert not one.training
    for p, q in zip(one.parameters(), two.parameters(), strict=True):
        assert torch.equal(p, q)


def test_classify_writes_probabilities_into_out_in_place() -> None:
    model = classify.make_model()
    inp = torch.from_numpy(np.random.default_rng(0).uniform(0, 1, (5, *classify.INPUT_SHAPE)).astype(np.float32))
    out = torch.full((5, classify.CLASSES), float("nan"))  # poisoned: an unwritten element stays NaN
    with torch.inference_mode():
        classify.classify(model, inp, out)
        want = torch.softmax(model(inp), dim=-1)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(out.sum(dim=-1), torch.ones(5))


@pytest.mark.parametrize("bad_shape", [(64, 64, 3), (1, 64, 64), (3, 8, 64), (3 * 64 * 64,)])
def test_out_spec_rejects_what_the_model_cannot_take(bad_shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="got shape"):
        classify.out_spec(bad_shape, np.dtype(np.float32))


def test_spec_feeds_the_stage_its_input_shape() -> None:
    spec = tomllib.loads((EXAMPLES_DIR / "classify-images.toml").read_text(encoding="utf-8"))
    src = spec["source"]
    assert (3, *src["size"]) == classify.INPUT_SHAPE and src["layout"] == "CHW" and src["mode"] == "RGB"
    (stage,) = spec["stages"]
    assert classify.out_spec(classify.INPUT_SHAPE, np.dtype(src["dtype"])) == (tuple(stage["out_shape"]),
                                                                             stage["out_dtype"])


def test_command_line_writes_the_images(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert classify.main(["make-images", str(tmp_path / "imgs"), "--count", "4", "--max-size", "64"]) == 0
    assert len(list((tmp_path / "imgs").iterdir())) == 4
    assert "wrote 4 images" in capsys.readouterr().out
