"""The model pickers carry short names, which the server turns back into its files; a missing file's
message points to the list only when the list has files."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import CheckpointError, EngineError
from tests.support.synth import model_config
from webui.messages import user_message
from webui.models_list import ModelCatalog


def test_picker_values_are_short_names_that_resolve_to_the_files(tmp_path) -> None:
    root = model_config("v2").parent
    catalog = ModelCatalog(root)
    pairs = catalog.picker_choices("sovits")
    assert pairs and all(label == value and "/" not in value for label, value in pairs)
    paths = dict(catalog.choices("sovits"))
    for label, value in pairs:
        assert catalog.resolve(value) == paths[label]
    gone = tmp_path / "gone.ckpt"
    assert catalog.key_for(gone, "gpt") == "gone.ckpt" and catalog.resolve("gone.ckpt") == str(gone.resolve())
    assert catalog.resolve("/some/typed/path.pth") == "/some/typed/path.pth"  # not a name: as it is
    assert catalog.listed_any
    empty = ModelCatalog(tmp_path / "nothing")
    assert empty.picker_choices("gpt") == [] and empty.picker_choices("sovits") == [] and not empty.listed_any


def test_a_missing_file_points_to_the_list_only_when_it_has_files() -> None:
    error = CheckpointError("sovits_weights '/w/s2G2333k.pth' does not exist")
    listed = user_message(error, "en", {"/w/s2G2333k.pth": "sovits"})
    assert "Pick a file from the list" in listed and "s2G2333k.pth" in listed and "/w/" not in listed
    for locale in ("en", "zh-CN", "ja", "ko"):
        empty = user_message(error, locale, {"/w/s2G2333k.pth": "sovits"}, weights_listed=False)
        assert "s2G2333k.pth" in empty and "sovits-studio download" in empty and "/w/" not in empty
        assert "Pick a file from the list" not in empty


def _looping_weight_folders(tmp_path):
    """A GPT-SoVITS root whose weight folders hold one real file of each kind beside symlink loops."""
    src = model_config("v2").parent / "GPT_SoVITS" / "pretrained_models" / "gsv-v2final-pretrained"
    root = tmp_path / "gsv"
    gpt_dir = root / "GPT_weights_v2"
    gpt_dir.mkdir(parents=True)
    (gpt_dir / "mine.ckpt").symlink_to(src / "s1bert25hz-5kh-longer-epoch=12-step=369668.ckpt")
    (gpt_dir / "a.ckpt").symlink_to(gpt_dir / "b.ckpt")  # a -> b -> a
    (gpt_dir / "b.ckpt").symlink_to(gpt_dir / "a.ckpt")
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "mine.pth").symlink_to(src / "s2G2333k.pth")
    (extra / "self.pth").symlink_to(extra / "self.pth")
    (extra / "here").symlink_to(extra)  # a folder that contains itself
    (extra / "sub").symlink_to(extra / "sub")
    looping = tmp_path / "looping"
    looping.symlink_to(looping)  # a configured folder that is itself a loop
    return root, (extra, looping)


def test_the_page_starts_and_rescans_with_symlink_loops_in_the_weight_folders(tmp_path) -> None:
    from engine.loading.model_pool import WeightPathError, check_weight_path

    root, extras = _looping_weight_folders(tmp_path)
    catalog = ModelCatalog(root, extra_dirs=extras)  # 2f66d90: RuntimeError "Symlink loop" at start
    from webui.handlers import rescan_choices
    gpt, sovits = rescan_choices(catalog)  # 2f66d90: OSError naming '.../GPT_weights_v2/a.ckpt'
    assert [label.split(" · ")[1] for label, _ in gpt] == ["s1bert25hz-5kh-longer-epoch=12-step=369668.ckpt"]
    assert [label.split(" · ")[1] for label, _ in sovits] == ["s2G2333k.pth"]
    roots = tuple(str(d) for d in catalog.folders)  # the weight roots the server is given, a loop among them
    real = catalog.resolve(sovits[0][1])
    assert check_weight_path(real, (*roots, str(Path(real).parent)), "sovits") == Path(real)  # 2f66d90: RuntimeError
    with pytest.raises(WeightPathError, match="cannot be followed"):
        check_weight_path(root / "GPT_weights_v2" / "a.ckpt", roots, "gpt")


def test_a_failed_rescan_names_no_server_path(tmp_path) -> None:
    from webui.handlers import RESCAN_FAILED, rescan_choices

    catalog = ModelCatalog(tmp_path)

    def broken(which):
        raise PermissionError(13, "Permission denied", "/srv/private/GPT_weights_v2")

    catalog.picker_choices = broken
    with pytest.raises(EngineError) as e:
        rescan_choices(catalog)
    assert str(e.value) == RESCAN_FAILED and "/srv" not in str(e.value)
