"""What crosses between the judge (the parent) and the candidate's process (the child), and how.

Two kinds of data, neither of which can run code in the reader:

* **messages**: one JSON object per message over a ``multiprocessing`` pipe, sent and received as
  bytes (:func:`send`, :func:`receive`). ``Connection.send`` / ``recv`` would pickle, and the
  parent unpickling what the candidate's process wrote would let the candidate run code in the
  judge; so they are never used in the parent's receiving direction. A message longer than
  :data:`MAX_MESSAGE_BYTES` is refused.
* **tensors**: safetensors files (:func:`write_tensors`, :func:`read_tensors`) named in the
  messages, each with the sha256 of its bytes. The parent writes the inputs, the child the outputs;
  each side checks the other's digest when it reads (a truncated or raced file is an error, not a
  silent wrong input). A digest proves the file arrived intact, not that its writer is honest: the
  parent judges the child's tensors with its own oracle whatever the child says about them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import torch

from harness.cases import DecodeCase, LinearCase, SoftmaxCase

#: The longest message accepted from the other side (the payload of a message is small: names,
#: reasons, tracebacks, timings; tensors travel in files).
MAX_MESSAGE_BYTES = 16 << 20


class ExchangeError(Exception):
    """A message or a tensor file that does not read back as what was sent."""


def send(conn, message: dict) -> None:
    """Send one JSON object (bytes on the pipe; no pickle)."""
    conn.send_bytes(json.dumps(message, allow_nan=True).encode())


def receive(conn) -> dict:
    """Receive one JSON object. Raises EOFError when the other side is gone, ExchangeError when what
    arrived is not a JSON object (or longer than :data:`MAX_MESSAGE_BYTES`)."""
    try:
        data = conn.recv_bytes(MAX_MESSAGE_BYTES)
    except OSError as e:  # multiprocessing raises OSError("bad message length") past the limit
        if "message length" in str(e):
            raise ExchangeError(f"a message longer than {MAX_MESSAGE_BYTES} bytes") from None
        raise
    try:
        msg = json.loads(data)
    except ValueError as e:
        raise ExchangeError(f"a message that is not JSON ({e})") from None
    if not isinstance(msg, dict):
        raise ExchangeError(f"a message that is not a JSON object ({type(msg).__name__})")
    return msg


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes. Not harness.check.golden's twin: importing that module here would
    import safetensors when the judge starts, while the vendor's directory may still be on sys.path
    (tests/accept/test_trust.py shadows safetensors there); this module imports it only inside calls."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def write_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> str:
    """Write ``tensors`` (any device, any layout) to a safetensors file; return its sha256.

    Each tensor is copied to a contiguous CPU tensor of its own (safetensors refuses views that
    share memory, and a candidate may return the same tensor twice)."""
    from safetensors.torch import save_file

    path = Path(path)
    plain = {name: t.detach().to("cpu", copy=True).contiguous() for name, t in tensors.items()}
    tmp = path.with_name(path.name + ".tmp")
    save_file(plain, str(tmp))
    os.replace(tmp, path)
    return file_sha256(path)


def read_tensors(path: Path, sha256: str | None, *, device=None) -> dict[str, torch.Tensor]:
    """The tensors of a file written by :func:`write_tensors`, after checking its sha256 (when
    given); on ``device`` (default CPU). Raises ExchangeError on a digest mismatch or a bad file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if sha256 is not None:
        got = file_sha256(path)
        if got != sha256:
            raise ExchangeError(f"{path.name}: sha256 {got[:16]}... differs from the announced {sha256[:16]}...")
    try:
        tensors = load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as e:
        raise ExchangeError(f"{path.name}: not a readable safetensors file ({e})") from None
    if device is not None and torch.device(device).type != "cpu":
        tensors = {k: v.to(device) for k, v in tensors.items()}
    return tensors


def case_to_dict(case) -> dict:
    """A case as a JSON object (its init fields and family)."""
    d = {f.name: getattr(case, f.name) for f in dataclasses.fields(case) if f.init}
    d["family"] = case.family
    return json.loads(json.dumps(d))  # tuples -> lists


def case_from_dict(d: dict):
    """The case of :func:`case_to_dict`."""
    d = dict(d)
    family = d.pop("family")
    if family == "softmax":
        if d.get("varlen") is not None:
            d["varlen"] = tuple(tuple(p) for p in d["varlen"])
        d["window"] = tuple(d.get("window", (-1, -1)))
        return SoftmaxCase(**d)
    if family == "linear":
        return LinearCase(**d)
    if family == "decode":
        d["window"] = tuple(d.get("window", (-1, -1)))
        return DecodeCase(**d)
    raise ValueError(f"case: unknown family {family!r}")
