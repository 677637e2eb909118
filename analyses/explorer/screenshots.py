"""Screenshots of the trajectory explorer for docs/explorer.md, taken by headless Chromium (playwright drives
Debian's `chromium`): the shipped trajectories side by side.

    geolens explore --run checkpoints/fb_lr6e-4_seed1 --run checkpoints/ln_lr6e-4_seed1 --out out/explorer_shipped
    python analyses/explorer/screenshots.py out/explorer_shipped docs/figures

writes explorer_over_training.png (the controls and every panel over training, the slider by epoch relative to
each run's onset, at the position nearest the onsets) and explorer_at_step_fb.png, explorer_at_step_ln.png (each run's per-step panels
at that step). PNGs are reduced to a 128-colour palette to stay small.
"""

from __future__ import annotations

import io
import shutil
import sys
from pathlib import Path

from PIL import Image
from playwright.sync_api import sync_playwright


def save_small(png: bytes, path: Path) -> None:
    Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=128).save(path, optimize=True)
    print(f"{path}: {path.stat().st_size / 1e3:.0f} kB")


def main(folder: str, out: str) -> None:
    folder, out = Path(folder).resolve(), Path(out)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto((folder / "index.html").as_uri())
        page.wait_for_function("document.body.dataset.rendered", timeout=300_000)
        page.select_option("#mode", "onset")
        page.wait_for_function("document.body.dataset.rendered", timeout=300_000)
        positions = page.evaluate("geolensExplorer.state.positions")
        zero = min(range(len(positions)), key=lambda j: abs(positions[j]))  # the position nearest the onsets
        page.fill("#step", str(zero))
        page.wait_for_function(f"document.body.dataset.rendered === '{zero}'", timeout=300_000)
        page.evaluate("window.scrollTo(0, 0)")
        top = page.locator("h1").bounding_box()["y"]
        bottom = page.locator("#over-training").bounding_box()
        save_small(page.screenshot(full_page=True, clip={"x": 0, "y": top - 10, "width": 1400,
                                                          "height": bottom["y"] + bottom["height"] - top + 20}),
                   out / "explorer_over_training.png")
        grids = page.locator("#at-step .grid")
        for i, name in enumerate(("fb", "ln")):
            save_small(grids.nth(i).screenshot(), out / f"explorer_at_step_{name}.png")
        browser.close()
    if errors:
        raise SystemExit(f"page errors: {errors}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
