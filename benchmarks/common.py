"""What every benchmark shares: the machine's name and writing results."""

from __future__ import annotations

import os
import platform
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine_description() -> str:
    """CPU model, core count and Python version, for the header of a results file."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}"


def write_markdown(name: str, text: str, out_dir: Path = RESULTS_DIR) -> Path:
    """Write ``text`` to ``out_dir/name.md`` and return the path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.md"
    path.write_text(text)
    return path
