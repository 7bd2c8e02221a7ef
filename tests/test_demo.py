"""`make demo`: configs/demo_cpu.yaml's header shows the commands the Makefile runs, and the vanilla run
beside MENTOR differs from it by the method alone (same seed, data, model, sampling, optimizer)."""

from __future__ import annotations

from pathlib import Path

from mentor_fast.config import load_config, to_dict

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "demo_cpu.yaml"


def _demo_commands() -> list[str]:
    """The Makefile's demo recipe, as a 1-rank `make demo` runs it: continuation lines joined, the
    rank variables empty."""
    recipe = (ROOT / "Makefile").read_text().split("\ndemo: venv\n", 1)[1].split("\n\n", 1)[0]
    commands = []
    for line in recipe.replace("\\\n", " ").splitlines():
        if "mentor-fast" in line:
            line = line.replace("$(BIN)/", "").replace("$(DEMO_RANKS)", "").replace("$(DEMO_SUFFIX)", "")
            commands.append(" ".join(line.split()))
    return commands


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def test_the_demo_config_header_shows_the_makefile_commands():
    commands = _demo_commands()
    assert [c.split()[1] for c in commands] == ["sft", "train", "train", "report"]
    header = [" ".join(line[1:].split()) for line in CONFIG.read_text().splitlines() if line.startswith("# mentor-fast")]
    assert header == commands


def test_the_vanilla_run_differs_from_the_mentor_run_by_the_method_only():
    train, vanilla = _demo_commands()[1:3]
    mentor_cfg = load_config([str(CONFIG)], [a for a in train.split()[4:] if "=" in a])
    vanilla_cfg = load_config([str(CONFIG)], [a for a in vanilla.split()[4:] if "=" in a])
    assert mentor_cfg.method == "mentor" and vanilla_cfg.method == "grpo"
    a, b = _flat(to_dict(mentor_cfg)), _flat(to_dict(vanilla_cfg))
    assert {k for k in a if a[k] != b.get(k)} == {"method", "mentor.enable", "output_dir"}
