"""Whether other geolens commits train with the same arithmetic as this checkout: for each commit, a
small sweep (two seeds stacked, p = 23, 60 epochs, one torch thread) per preset, run from a temporary
git worktree of that commit, and its checkpoints compared bit for bit with this checkout's.

    python analyses/reproduction/same_arithmetic.py                   # every commit docs/reproduction.md names
    python analyses/reproduction/same_arithmetic.py 300be03 4f8753c   # these commits

Prints one line per preset: "=" where a commit's checkpoints equal this checkout's, "differs" where
not ("failed: ..." where that commit could not run the sweep); exits 1 when any is not "=". Bit
identity holds on one machine only: another CPU trains in another float order (run.json segments
record the machine).
"""

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from geolens.runs.storage import load_tensors

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ("fb", "sphere", "ln", "rms")
# one torch thread through OMP_NUM_THREADS (older commits have no --threads)
SWEEP = ["sweep", "--seeds", "1-2", "--p", "23", "--epochs", "60", "--eval-every", "10", "--quiet"]


def doc_commits(doc: Path = ROOT / "docs" / "reproduction.md") -> list[str]:
    """The commits a doc names in backquotes (`abcdef0`: 7 to 40 hex digits that git knows as a
    commit), in order of first mention."""
    def is_commit(name: str) -> bool:
        check = ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"]
        return subprocess.run(check, capture_output=True).returncode == 0

    return [c for c in dict.fromkeys(re.findall(r"`([0-9a-f]{7,40})`", doc.read_text())) if is_commit(c)]


def train(source: Path, preset: str, out: Path) -> str | None:
    """The small sweep of one preset, by the geolens package in `source` (a checkout or worktree);
    None, or the last line of its error output when it failed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(source)}
    done = subprocess.run([sys.executable, "-m", "geolens", *SWEEP, "--preset", preset, "--out", str(out)],
                          cwd=source, env=env, capture_output=True, text=True)
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["no error output"])[-1]


def same_checkpoints(a: Path, b: Path) -> bool:
    """Whether the sweep folders a and b hold the same checkpoint files, every tensor bit for bit."""
    files = sorted(p.relative_to(a) for p in a.rglob("*.safetensors"))
    if not files or files != sorted(p.relative_to(b) for p in b.rglob("*.safetensors")):
        return False
    for name in files:
        ta, tb = load_tensors(a / name), load_tensors(b / name)
        if ta.keys() != tb.keys() or not all(torch.equal(ta[k], tb[k]) for k in ta):
            return False
    return True


def compare(commits: list[str], presets: tuple[str, ...] = PRESETS) -> dict[str, dict[str, str]]:
    """preset -> commit -> "=" (its checkpoints equal this checkout's), "differs", or "failed: <error>"."""
    out: dict[str, dict[str, str]] = {p: {} for p in presets}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for preset in presets:
            error = train(ROOT, preset, tmp / "here" / preset)
            if error:
                raise SystemExit(f"this checkout failed to train {preset}: {error}")
        for commit in commits:
            tree = tmp / f"tree_{commit}"
            added = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit],
                                   capture_output=True, text=True)
            if added.returncode != 0:
                why = (added.stderr.strip().splitlines() or ["git worktree add failed"])[-1]
                for preset in presets:
                    out[preset][commit] = f"failed: {why}"
                continue
            try:
                for preset in presets:
                    error = train(tree, preset, tmp / commit / preset)
                    same = not error and same_checkpoints(tmp / "here" / preset, tmp / commit / preset)
                    out[preset][commit] = f"failed: {error}" if error else "=" if same else "differs"
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                               capture_output=True)
    return out


if __name__ == "__main__":
    commits = sys.argv[1:] or doc_commits()
    result = compare(commits)
    for preset, by_commit in result.items():
        print(f"{preset:7}", "  ".join(f"{commit}: {verdict}" for commit, verdict in by_commit.items()))
    sys.exit(0 if all(v == "=" for r in result.values() for v in r.values()) else 1)
