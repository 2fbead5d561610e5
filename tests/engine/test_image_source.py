"""Image folders as inputs (engine/edges/image_source.py): every mode, layout, resize policy and
dtype matches Pillow applied directly; a bad image fails alone with its path and reason; an image
over max_pixels is refused before decoding; keys come from relative paths; counting opens nothing."""

from __future__ import annotations

import errno
import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageFile, ImageOps
from wd_stages import RecordingSink

from warpdeck.engine.api import Engine, RunReport, SpecError, parse_spec
from warpdeck.engine.edges.config import ImageSource
from warpdeck.engine.edges.image_source import ImageSourceImpl, image_key

SIZE = (12, 16)  # [H, W]


def _spec(folder: Path, **source: Any) -> Any:
    return parse_spec({
        "name": "images", "batch_size": 4,
        "source": {"kind": "images", "path": str(folder), "glob": "**/*", "size": list(SIZE), **source},
        "sink": {"kind": "null"}, "stages": [{"fn": "wd_stages:poison"}],  # poison copies its input
    }, "<test>")


async def _run(spec: Any, run_dir: Path | None = None) -> tuple[RunReport, Engine, RecordingSink]:
    sink = RecordingSink()
    async with Engine(spec, run_dir, sink=sink) as eng:
        return await eng.wait(), eng, sink


def _pixels(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _write_images(folder: Path) -> dict[str, Path]:
    """One image per format, input mode and geometry (smaller, larger, other aspect, exact)."""
    folder.mkdir(parents=True, exist_ok=True)
    made: dict[str, Image.Image] = {
        "rgb_small.png": Image.fromarray(_pixels((6, 8, 3), 1)),
        "l_large.jpg": Image.fromarray(_pixels((150, 200), 2)),
        "rgba_wide.webp": Image.fromarray(_pixels((20, 100, 4), 3)),
        "p_tall.png": Image.fromarray(_pixels((40, 10, 3), 4)).convert("P"),
        "i16.png": Image.frombytes("I;16", (30, 30), _pixels((30, 30, 2), 5).tobytes()),
        "cmyk.jpg": Image.fromarray(_pixels((40, 50, 3), 6)).convert("CMYK"),
        "rgb_exact.webp": Image.fromarray(_pixels((SIZE[0], SIZE[1], 3), 7)),
    }
    paths = {}
    for name, img in made.items():
        path = folder / name
        img.save(path, lossless=True) if name.endswith(".webp") else img.save(path)
        paths[name.rsplit(".", 1)[0]] = path
    return paths


def _reference(path: Path, mode: str, layout: str, resize: str, dtype: str, pad_value: int = 0) -> np.ndarray:
    """Pillow applied directly: convert, then resize by the policy, then the array."""
    h, w = SIZE
    with Image.open(path) as opened:
        img = opened.convert(mode)
        if resize == "fit":
            img = img.resize((w, h), Image.Resampling.BILINEAR)
        elif resize == "crop":
            img = ImageOps.fit(img, (w, h), Image.Resampling.BILINEAR)
        else:
            img = ImageOps.pad(img, (w, h), Image.Resampling.BILINEAR, color=(pad_value,) * len(mode))
        a = np.asarray(img).reshape(h, w, len(mode))
    if layout == "CHW":
        a = a.transpose(2, 0, 1)
    return a.astype(np.float32) / np.float32(255.0) if dtype == "float32" else a


@pytest.mark.parametrize("dtype", ["uint8", "float32"])
@pytest.mark.parametrize("resize", ["fit", "crop", "pad"])
@pytest.mark.parametrize("layout", ["HWC", "CHW"])
@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA"])
async def test_every_image_matches_pillow_applied_directly(tmp_path: Path, mode: str, layout: str,
                                                           resize: str, dtype: str) -> None:
    paths = _write_images(tmp_path / "in")
    report, _, sink = await _run(_spec(tmp_path / "in", mode=mode, layout=layout, resize=resize, dtype=dtype,
                                       pad_value=7))
    assert (report.counts.done, report.counts.failed) == (len(paths), 0)
    for key, path in paths.items():
        want = _reference(path, mode, layout, resize, dtype, pad_value=7)
        got = sink.out[key]
        assert got.dtype == want.dtype and got.shape == want.shape, key
        np.testing.assert_array_equal(got, want, err_msg=key)


async def test_pad_surrounds_the_centred_image_with_pad_value(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    Image.new("L", (4, 12), 200).save(tmp_path / "in" / "narrow.png")  # 12 high: scales to 12x4, centred
    _, _, sink = await _run(_spec(tmp_path / "in", mode="L", resize="pad", pad_value=9))
    got = sink.out["narrow"][:, :, 0]
    assert (got[:, :6] == 9).all() and (got[:, 10:] == 9).all() and (got[:, 6:10] == 200).all()


def _fault_folder(folder: Path) -> dict[str, str]:
    """Good 20x20 images and one of each fault; returns the faulty keys and the reason each gives."""
    folder.mkdir()
    for i in range(6):
        Image.fromarray(_pixels((20, 20, 3), i)).save(folder / f"good{i}.png")
    whole = (folder / "good0.png").read_bytes()
    (folder / "truncated.png").write_bytes(whole[: len(whole) // 2])
    (folder / "empty.png").write_bytes(b"")
    (folder / "text.jpg").write_text("this is not a JPEG\n")
    Image.fromarray(_pixels((40, 40, 3), 9)).save(folder / "bomb.png")  # 1600 pixels, over max_pixels
    (folder / "locked.png").write_bytes(whole)
    (folder / "folder.png").mkdir()  # named like an image: it fails alone, named (issue 28, item 7)
    return {"truncated": "corrupt or truncated image", "empty": "empty file",
            "text": "not a PNG, JPEG or WebP image", "bomb": "over max_pixels (1000); refused before decoding",
            "locked": "unreadable: Permission denied", "folder": "not a regular file (a directory)"}


async def test_each_bad_image_fails_alone_with_its_path_and_reason(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "in"
    faults = _fault_folder(folder)
    locked = folder / "locked.png"
    if os.geteuid() == 0:  # root reads a chmod 000 file: inject the EACCES at the open instead
        real = os.open

        def refusing(path: Any, *a: Any, **kw: Any) -> int:
            if Path(path) == locked:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            return real(path, *a, **kw)

        monkeypatch.setattr(os, "open", refusing)
    else:
        locked.chmod(0)
    decoded: list[tuple[int, int]] = []
    real_load = ImageFile.ImageFile.load

    def counting_load(self: ImageFile.ImageFile) -> Any:
        decoded.append(self.size)
        return real_load(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", counting_load)
    try:
        report, eng, sink = await _run(_spec(folder, max_pixels=1000))
    finally:
        locked.chmod(0o644)
    assert (report.counts.done, report.counts.failed) == (6, len(faults))
    assert set(sink.out) == {f"good{i}" for i in range(6)}
    for key, reason in faults.items():
        d = eng.task_detail(key)
        assert d is not None and d.state == "failed" and d.attempt == 1, d
        assert str(folder / key) in d.error and reason in d.error, d.error
    assert (40, 40) not in decoded  # the bomb's header was read, its pixels never


async def test_pillows_own_bomb_check_becomes_the_same_refusal(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "in").mkdir()
    Image.fromarray(_pixels((20, 20, 3), 1)).save(tmp_path / "in" / "big.png")
    Image.fromarray(_pixels((5, 5, 3), 2)).save(tmp_path / "in" / "small.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 400 pixels: over twice Pillow's limit
    report, eng, _ = await _run(_spec(tmp_path / "in"))
    assert (report.counts.done, report.counts.failed) == (1, 1)
    d = eng.task_detail("big")
    assert d is not None and "refused before decoding" in d.error and "decompression bomb" in d.error, d.error


async def test_keys_come_from_relative_paths_made_safe(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    formats = {".png": "PNG", ".jpg": "JPEG", ".webp": "WEBP"}
    for rel in ("a/b/img 1.png", "top.jpg", "c/.hidden.webp", ".dot.png", "d/é ü.PNG"):
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(_pixels((4, 4, 3), 0)).save(folder / rel, format=formats[Path(rel).suffix.lower()])
    report, eng, sink = await _run(_spec(folder))
    assert report.counts.done == 5
    assert set(sink.out) == {"a__b__img_1", "top", "c__.hidden", "_dot", "d_____"}
    assert eng.source.describe("a__b__img_1").startswith(str(folder / "a/b/img 1.png"))  # type: ignore[attr-defined]


def test_a_long_path_keeps_a_unique_safe_key() -> None:
    a, b = image_key(Path("x" * 300 + "a.png")), image_key(Path("x" * 300 + "b.png"))
    assert len(a) == len(b) == 200 and a != b


def test_two_files_with_one_key_are_a_spec_error_naming_both(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    for name in ("x.png", "x.jpg"):
        (tmp_path / "in" / name).write_bytes(b"")
    with pytest.raises(SpecError) as err:
        ImageSourceImpl(ImageSource(kind="images", path=tmp_path / "in", size=SIZE))
    assert err.value.issues[0].loc == "source.glob"
    assert "x.jpg" in str(err.value) and "x.png" in str(err.value) and "'x'" in str(err.value)


def test_counting_lists_files_without_opening_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(10_000):
        (folder / f"{i:05d}.png").touch()
    (folder / "notes.txt").touch()  # not an image name: not a task

    def no_open(*a: Any, **kw: Any) -> Any:
        raise AssertionError("counting opened an image")

    monkeypatch.setattr(Image, "open", no_open)
    src = ImageSourceImpl(ImageSource(kind="images", path=folder, size=SIZE))
    assert src.total == 10_000
    assert sum(1 for _ in src.items()) == 10_000


async def test_a_resumed_run_opens_no_finished_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = _write_images(tmp_path / "in")
    spec = _spec(tmp_path / "in")
    first, _, _ = await _run(spec, tmp_path / "run")
    assert first.counts.done == len(paths)
    opened: list[Any] = []
    real = Image.open
    monkeypatch.setattr(Image, "open", lambda fp, *a, **kw: opened.append(fp) or real(fp, *a, **kw))
    _, eng, sink = await _run(spec, tmp_path / "run")
    assert eng.resume is not None and eng.resume.skipped_done == len(paths)
    assert opened == [] and sink.out == {}


def test_a_spec_without_pillow_is_refused_naming_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "PIL" else real(name, *a))
    with pytest.raises(SpecError) as err:
        _spec(Path("in"))
    assert str(err.value.issues[0]) == "source.kind: needs Pillow: pip install 'warpdeck[images]' (got 'images')"


def _spec_file(tmp_path: Path) -> Path:
    (tmp_path / "spec.toml").write_text(
        'name = "imgs"\nbackend = "numpy"\n[source]\nkind = "images"\npath = "in"\nsize = [4, 4]\n'
        '[sink]\nkind = "null"\n[[stages]]\nfn = "wd_stages:poison"\n')
    return tmp_path / "spec.toml"


@pytest.mark.parametrize("case", ["no Pillow", "one key, two files"])
def test_the_cli_refuses_with_exit_2_naming_the_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str], case: str) -> None:
    from warpdeck.cli.main import main

    (tmp_path / "in").mkdir()
    for name in ("x.png", "x.jpg"):
        (tmp_path / "in" / name).write_bytes(b"")
    if case == "no Pillow":
        real = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "PIL" else real(name, *a))
    code = main(["run", str(_spec_file(tmp_path)), "--headless", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2
    assert ("source.kind: needs Pillow" if case == "no Pillow" else "source.glob: ") in err, err
