"""Any OpenAI-compatible chat endpoint (a local vLLM / `transformers serve` / llama.cpp server, or a
remote API), standard library only: urllib + a thread pool.

Every failure is per item: the item's reply is None, the run goes on without that hint, and the
kind is counted as `errors/<kind>`: timeout, connection, http_<code>, malformed (a body that is not
JSON, or JSON without choices[0].message.content). Timeouts, connection errors, 429 and 5xx are
retried (`retries` times, short backoff); other 4xx are not.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from mentor_fast.mentor.counts import Counts
from mentor_fast.mentor.writers.base import Messages

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class _Failure(Exception):
    def __init__(self, kind: str, retry: bool) -> None:
        super().__init__(kind)
        self.kind, self.retry = kind, retry


class OpenAIBackend:
    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 60.0,
        retries: int = 1,
        concurrency: int = 4,
        backoff_s: float = 0.2,
        counts: Counts | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.api_key_env = model, api_key_env
        self.timeout_s, self.retries, self.concurrency, self.backoff_s = (
            timeout_s,
            retries,
            max(1, concurrency),
            backoff_s,
        )
        self.counts = counts if counts is not None else Counts()
        host = urllib.parse.urlparse(self.url).hostname or ""
        # A loopback server must not be sent through an http_proxy from the environment.
        handlers = [urllib.request.ProxyHandler({})] if host in _LOOPBACK else []
        self._opener = urllib.request.build_opener(*handlers)

    def complete(self, batch: list[Messages], max_tokens: int, temperature: float) -> list[str | None]:
        if not batch:
            return []
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(batch))) as pool:
            return list(pool.map(lambda m: self._one(m, max_tokens, temperature), batch))

    def _one(self, messages: Messages, max_tokens: int, temperature: float) -> str | None:
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        for attempt in range(self.retries + 1):
            try:
                text = self._post(body)
                self.counts.add("requests/ok")
                return text
            except _Failure as f:
                if not f.retry or attempt == self.retries:
                    self.counts.add(f"errors/{f.kind}")
                    return None
                self.counts.add("retries/http")
                time.sleep(self.backoff_s * 2**attempt)
        return None  # unreachable: the loop returns

    def _post(self, body: dict) -> str:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            e.close()
            raise _Failure(f"http_{e.code}", retry=e.code >= 500 or e.code == 429) from None
        except urllib.error.URLError as e:
            timeout = isinstance(e.reason, (TimeoutError, socket.timeout))
            raise _Failure("timeout" if timeout else "connection", retry=True) from None
        except TimeoutError:
            raise _Failure("timeout", retry=True) from None
        except (ConnectionError, OSError):  # reset / refused while reading
            raise _Failure("connection", retry=True) from None
        except http.client.HTTPException:  # not an HTTP reply, or a body cut short
            raise _Failure("malformed", retry=True) from None
        try:
            content = json.loads(raw)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise _Failure("malformed", retry=True) from None
        if not isinstance(content, str):
            raise _Failure("malformed", retry=True)
        return content
