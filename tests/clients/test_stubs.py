"""The checked-in stubs in radixd_client/_pb must equal a fresh `make proto` run."""

from __future__ import annotations

from pathlib import Path

from radixd_client import protogen

PB_DIR = Path(protogen.__file__).resolve().parent / "_pb"


def test_checked_in_stubs_are_fresh(tmp_path: Path) -> None:
    fresh = tmp_path / "_pb"
    written = protogen.generate(out_dir=fresh)
    fresh_names = {p.name for p in written}
    checked_in = {p.name for p in PB_DIR.iterdir() if p.is_file() and p.suffix in {".py", ".pyi"}}
    assert fresh_names == checked_in, "stub files differ from proto/: run `make proto` and commit _pb/"
    stale = [n for n in sorted(fresh_names) if (fresh / n).read_text() != (PB_DIR / n).read_text()]
    assert not stale, f"stale generated stubs {stale}: run `make proto` and commit clients/radixd_client/_pb/"


def test_stubs_use_package_relative_imports() -> None:
    for path in PB_DIR.glob("*.py*"):
        text = path.read_text()
        assert "from radixd.v1 import" not in text, f"{path.name} imports radixd.v1 absolutely"


def test_staleness_is_detected(tmp_path: Path) -> None:
    """Changing a .proto must change the generated output (so the check above can fail)."""
    proto_root = tmp_path / "proto"
    (proto_root / "radixd" / "v1").mkdir(parents=True)
    src_root = Path(protogen.__file__).resolve().parents[2] / "proto" / "radixd" / "v1"
    for src in src_root.glob("*.proto"):
        text = src.read_text()
        if src.name == "generation.proto":
            text = text.replace("int32 priority = 4;", "int32 priority = 4;\n  bool extra_field = 5;")
        (proto_root / "radixd" / "v1" / src.name).write_text(text)
    out = tmp_path / "_pb"
    protogen.generate(proto_dir=proto_root, out_dir=out)
    assert (out / "generation_pb2.py").read_text() != (PB_DIR / "generation_pb2.py").read_text()
