"""Launch scripts for a Megatron-LM command: torchrun on one node, sbatch for several.

Every user-given value reaches the script through `shlex.quote`/`shlex.join`; nothing is
pasted into a shell string unquoted. A one-node job gets a bash script that runs torchrun;
a multi-node job gets an sbatch script that starts one torchrun per node with `srun`, all
meeting at a c10d rendezvous on the first node of the allocation (Slurm's variables).

    path = write_script(command, settings, Path("run_01.sh"), label="tp2 pp4 dp16 mb1")
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path

from layoutsearch.megatron.args import MegatronCommand
from layoutsearch.megatron.settings import MegatronSettings


def torchrun_argv(command: MegatronCommand, settings: MegatronSettings, *,
                  master_addr: str = "localhost", node_rank: int = 0) -> list[str]:
    """The full argv of one node's torchrun (single-node form, explicit rank and master)."""
    return [
        *settings.launch_prefix(),
        "--nproc_per_node", str(command.nproc_per_node),
        "--nnodes", str(command.nodes),
        "--node_rank", str(node_rank),
        "--master_addr", master_addr,
        "--master_port", str(settings.master_port),
        str(settings.script_path),
        *command.argv,
    ]


def _exports(env: Mapping[str, str]) -> list[str]:
    return [f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items())]


def _header(command: MegatronCommand, label: str) -> list[str]:
    lines = [f"# layoutsearch: {label}" if label else "# layoutsearch launch script"]
    lines += [f"# caveat: {note}" for note in command.notes]
    return lines


def torchrun_script(command: MegatronCommand, settings: MegatronSettings,
                    label: str = "") -> str:
    """A bash script that runs the command with torchrun on this node."""
    return "\n".join([
        "#!/usr/bin/env bash",
        *_header(command, label),
        "set -euo pipefail",
        *_exports(command.env),
        shlex.join(torchrun_argv(command, settings)),
        "",
    ])


def sbatch_script(command: MegatronCommand, settings: MegatronSettings, label: str = "",
                  job_name: str = "layoutsearch") -> str:
    """An sbatch script: one torchrun per node, c10d rendezvous on the first node."""
    minutes = max(1, int(-(-settings.timeout_s // 60)))
    directives = {
        "job-name": job_name,
        "nodes": str(command.nodes),
        "ntasks-per-node": "1",
        "gpus-per-node": str(command.nproc_per_node),
        "time": f"{minutes // 60:02d}:{minutes % 60:02d}:00",
    }
    for key, value in settings.slurm.items():
        # submitit-style names (slurm_partition) become sbatch directives (--partition).
        directives[str(key).removeprefix("slurm_").replace("_", "-")] = str(value)
    torchrun = [
        *settings.launch_prefix(),
        "--nproc_per_node", str(command.nproc_per_node),
        "--nnodes", str(command.nodes),
        "--rdzv_backend", "c10d",
    ]
    # The rendezvous id and endpoint come from Slurm at run time, so they stay shell
    # variables; everything else is quoted literally.
    rendezvous = '--rdzv_id "$SLURM_JOB_ID" --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT"'
    tail = shlex.join([str(settings.script_path), *command.argv])
    return "\n".join([
        "#!/usr/bin/env bash",
        *[f"#SBATCH --{key}={shlex.quote(value)}" for key, value in directives.items()],
        *_header(command, label),
        "set -euo pipefail",
        *_exports(command.env),
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        f"MASTER_PORT={settings.master_port}",
        "export MASTER_ADDR MASTER_PORT",
        f"srun --ntasks-per-node=1 {shlex.join(torchrun)} {rendezvous} {tail}",
        "",
    ])


def write_script(command: MegatronCommand, settings: MegatronSettings, path: Path,
                 label: str = "") -> Path:
    """Write the torchrun (one node) or sbatch (several) script; executable."""
    text = (torchrun_script(command, settings, label) if command.nodes == 1
            else sbatch_script(command, settings, label, job_name=path.stem))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path
