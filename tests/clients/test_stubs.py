"""The checked-in stubs and descriptor set in radixd_client/_pb must equal a fresh `make proto` run."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import descriptor_pb2
from radixd_client import protogen

PB_DIR = Path(protogen.__file__).resolve().parent / "_pb"
GENERATED_SUFFIXES = {".py", ".pyi", ".binpb"}


def test_checked_in_stubs_are_fresh(tmp_path: Path) -> None:
    fresh = tmp_path / "_pb"
    written = protogen.generate(out_dir=fresh)
    fresh_names = {p.name for p in written}
    checked_in = {p.name for p in PB_DIR.iterdir() if p.is_file() and p.suffix in GENERATED_SUFFIXES}
    assert fresh_names == checked_in, "stub files differ from proto/: run `make proto` and commit _pb/"
    stale = [n for n in sorted(fresh_names) if (fresh / n).read_bytes() != (PB_DIR / n).read_bytes()]
    assert not stale, f"stale generated stubs {stale}: run `make proto` and commit clients/radixd_client/_pb/"


def test_stubs_use_package_relative_imports() -> None:
    for path in PB_DIR.glob("*.py*"):
        text = path.read_text()
        assert "from radixd.v1 import" not in text, f"{path.name} imports radixd.v1 absolutely"


def _generate_edited(tmp_path: Path, name: str, old: str, new: str) -> Path:
    """Generate from a copy of proto/ with `old` replaced by `new` in `name`; returns the output folder."""
    proto_root = tmp_path / "proto"
    (proto_root / "radixd" / "v1").mkdir(parents=True)
    src_root = Path(protogen.__file__).resolve().parents[2] / "proto" / "radixd" / "v1"
    for src in src_root.glob("*.proto"):
        text = src.read_text()
        if src.name == name:
            assert old in text, f"{name} no longer contains {old!r}; update this test"
            text = text.replace(old, new)
        (proto_root / "radixd" / "v1" / src.name).write_text(text)
    out = tmp_path / "_pb"
    protogen.generate(proto_dir=proto_root, out_dir=out)
    return out


def test_staleness_is_detected(tmp_path: Path) -> None:
    """Changing a .proto must change the generated output (so the check above can fail)."""
    out = _generate_edited(
        tmp_path, "generation.proto", "int32 priority = 4;", "int32 priority = 4;\n  bool extra_field = 5;"
    )
    assert (out / "generation_pb2.py").read_text() != (PB_DIR / "generation_pb2.py").read_text()


def test_comment_edits_make_the_descriptor_set_stale(tmp_path: Path) -> None:
    """Reflection serves comments from descriptors.binpb, so a comment-only edit must show as stale."""
    out = _generate_edited(tmp_path, "common.proto", "0 = greedy.", "0 = greedy (argmax).")
    assert (out / "common_pb2.py").read_text() == (PB_DIR / "common_pb2.py").read_text()
    fresh = descriptor_pb2.FileDescriptorSet.FromString((out / protogen.DESCRIPTOR_SET).read_bytes())
    comments = [loc.leading_comments for f in fresh.file for loc in f.source_code_info.location]
    assert any("0 = greedy (argmax)." in c for c in comments)
    assert (out / protogen.DESCRIPTOR_SET).read_bytes() != (PB_DIR / protogen.DESCRIPTOR_SET).read_bytes()
