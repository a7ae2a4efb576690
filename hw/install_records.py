"""Put one device call's testbed records where the repository keeps them, the ones they
replace kept and marked ``superseded_by`` (``python -m lever.hw.install_records``).

Why a tool: a kernel change that moves the emulator's latencies replaces every emulated
record at once (hw/run_hwfix_on_device.sh measures them in one call), and the replaced ones
must stay readable but out of calibrate/validate (docs/records.md). By hand that is ~70
moves across four folders; a slip leaves two generations side by side, which the tests
then refuse (one build per folder).

Where things go (``FROM`` holds the call's files: ``bed/``, ``v2/``, ``diag/``):

* V1 lever records ``emu-bed-*`` -> ``calibration/data/`` (training records); the chain,
  lateness, placement, ``-rxdev`` and baseline ``-repeat-`` runs and the outcome files -> ``calibration/data/testbed/``;
* V2 records -> ``calibration/data/v2/`` (``-rxdev`` ones -> ``v2/rxdev/``);
* credit diagnostics -> ``calibration/data/testbed/credit-diag/``, and the baselines already
  shipped as calibration records (``calibration/data/emu-bed-diag-*``, id prefixed so)
  replaced there too;
* every record replaced -> ``before-hwfix-<old rev>/`` beside where it was, ``superseded_by``
  saying why; logs as ``device-log-<rev>.txt``. Smoke runs are not kept.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tarfile
import tempfile
from pathlib import Path

from lever.calibration.records import DATA_DIR

WHY = ("re-measured at {rev} (hw/run_hwfix_on_device.sh): the emulated NIC keeps its per-WQE "
       "bookkeeping in shared memory with one warp fetching, and the receive CQs are host memory "
       "(hw/emulated_nic.toml rxcq), which moved the testbed's latencies. Kept for their history")
DIAG = re.compile(r"-chain|-late-|-sq(dev|hos)-cq|-rxdev|-repeat-")


def _old_rev(p: Path) -> str:
    return str(json.loads(p.read_text()).get("provenance", {}).get("git_rev", "unknown"))[:7]


def supersede(old: Path, rev: str) -> Path:
    """Move a replaced record into before-hwfix-<its rev>/ beside it, marked superseded."""
    d = json.loads(old.read_text())
    d["superseded_by"] = WHY.format(rev=rev)
    dest = old.parent / f"before-hwfix-{_old_rev(old)}" / old.name
    dest.parent.mkdir(exist_ok=True)
    dest.write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")
    old.unlink()
    return dest


def place(new: Path, folder: Path, rev: str, moved: list[Path]) -> None:
    """Install one new record into folder, superseding the one of the same name there."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / new.name
    if target.exists() and "latency_us" in json.loads(target.read_text()):  # outcome files: replaced
        moved.append(supersede(target, rev))
    shutil.copyfile(new, target)


def _untar(tgz: Path, into: Path) -> Path:
    with tarfile.open(tgz) as t:
        t.extractall(into, filter="data")
    return into


def install(src: Path, rev: str, data: Path = DATA_DIR) -> dict[str, list[str]]:
    """Install what src (the device call's files) holds; returns what went where."""
    installed: list[str] = []
    moved: list[Path] = []
    bed_tb, v2_dir = data / "testbed", data / "v2"
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        bed = _untar(src / "bed" / "records.tgz", t / "bed") / "bed_rec"
        v2 = _untar(src / "v2" / "records.tgz", t / "v2") / "v2_rec"
        diag = _untar(src / "diag" / "diag.tgz", t / "diag") if (src / "diag" / "diag.tgz").exists() else None
        # the credit-diag baselines shipped as calibration records (emu-bed-diag-*, measured as diag-*)
        shipped_diag = {p.name[len("emu-bed-"):] for p in data.glob("emu-bed-diag-*.json")}
        # every shipped V1 record is replaced, also one this call did not make (no stale mix)
        for old in sorted(data.glob("emu-bed-*.json")):
            moved.append(supersede(old, rev))
        for p in sorted(bed.glob("*.json")):
            if p.name.endswith("-outcome.json") or DIAG.search(p.stem):
                place(p, bed_tb, rev, moved)
            elif p.name.startswith("emu-bed-") and not p.name.startswith("emu-bed-diag-"):
                place(p, data, rev, moved)
            else:
                continue
            installed.append(p.name)
        for old in sorted(v2_dir.glob("emu-*.json")):
            moved.append(supersede(old, rev))
        for p in sorted(v2.glob("emu-*.json")):
            place(p, v2_dir / "rxdev" if "-rxdev" in p.stem else v2_dir, rev, moved)
            installed.append(p.name)
        if diag is not None:
            for p in sorted(diag.glob("diag-*.json")):
                place(p, bed_tb / "credit-diag", rev, moved)
                if p.name in shipped_diag:  # a baseline shipped as a calibration record
                    d = json.loads(p.read_text())
                    d["id"] = "emu-bed-" + d["id"]
                    d["how"]["notes"] += (f"; shipped as {d['id']} (measured as {p.stem}, "
                                          "calibration/data/testbed/credit-diag)")
                    shipped = t / ("emu-bed-" + p.name)
                    shipped.write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")
                    place(shipped, data, rev, moved)
                installed.append(p.name)
    for sub, name in (("bed", bed_tb / f"device-log-{rev[:7]}.txt"), ("v2", v2_dir / f"device-log-{rev[:7]}.txt"),
                      ("diag", bed_tb / "credit-diag" / "log.txt")):
        if (src / sub / "log.txt").exists():
            shutil.copyfile(src / sub / "log.txt", name)
    return {"installed": installed, "superseded": [str(p.relative_to(data)) for p in moved]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rev", required=True, help="the 40-hex commit the device call ran")
    ap.add_argument("--from", dest="src", required=True, help="the call's files (bed/, v2/, diag/)")
    a = ap.parse_args(argv)
    if not re.fullmatch(r"[0-9a-f]{40}", a.rev):
        ap.error("--rev: a 40-hex commit")
    res = install(Path(a.src), a.rev)
    print(f"installed {len(res['installed'])} records, superseded {len(res['superseded'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
