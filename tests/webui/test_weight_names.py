"""The model pickers carry short names, which the server turns back into its files; a missing file's
message points to the list only when the list has files."""

from __future__ import annotations

from engine.errors import CheckpointError
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
