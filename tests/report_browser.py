"""Open an HTML report in real headless Chromium (Debian's chromium package, .ci/apt/compare.txt):
the rendered DOM and a screenshot. Every browser process is gone when a call returns."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]


def _browser() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "chromium is not installed (apt-get install chromium; listed in .ci/apt/compare.txt)"
    return path


def _browser_pids(profile: Path) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if str(profile).encode() in (d / "cmdline").read_bytes():
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    profile = tmp_path / f"chromium-profile-{time.monotonic_ns()}"
    profile.mkdir()
    proc = subprocess.Popen([_browser(), *FLAGS, f"--user-data-dir={profile}", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    deadline = time.time() + 10
    while _browser_pids(profile) and time.time() < deadline:
        time.sleep(0.1)
    assert _browser_pids(profile) == [], "a chromium process outlived the call"
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def chromium_dom(html: Path, tmp_path: Path) -> str:
    r = _run(["--dump-dom", html.resolve().as_uri()], tmp_path)
    assert r.returncode == 0 and "<html" in r.stdout, r.stderr[-2000:]
    return r.stdout


def chromium_screenshot(html: Path, tmp_path: Path, size: str = "1280,2400") -> Path:
    png = tmp_path / f"{html.stem}.png"
    r = _run([f"--screenshot={png}", f"--window-size={size}", html.resolve().as_uri()], tmp_path)
    assert r.returncode == 0 and png.exists() and png.stat().st_size > 0, r.stderr[-2000:]
    return png


def _pixels(png: Path):
    import numpy as np
    from PIL import Image

    with Image.open(png) as img:
        return np.asarray(img.convert("RGB"), dtype=int).reshape(-1, 3)


def distinct_colours(png: Path) -> int:
    import numpy as np

    return len(np.unique(_pixels(png), axis=0))


def pixels_of(png: Path, rgb: tuple[int, int, int], tolerance: int = 6) -> int:
    import numpy as np

    return int((np.abs(_pixels(png) - np.array(rgb)) <= tolerance).all(axis=1).sum())
