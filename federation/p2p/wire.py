"""The messages peers exchange: a JSON header and raw arrays, framed as one byte string (docs/p2p.md,
"Messages"). Nothing here is pickled: a received message is parsed as JSON and typed arrays only.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = ["Message", "encode", "decode", "MessageError", "MODEL_KINDS"]

#: message kinds that carry model payloads (the ledger's model bytes)
MODEL_KINDS = frozenset({"model", "up", "down"})
_DTYPES = {"float32": np.float32, "float64": np.float64, "bfloat16": np.uint16, "int64": np.int64}


class MessageError(ValueError):
    """A byte string that is not a well-formed message."""


@dataclass
class Message:
    """One message.

    Attributes:
        kind: ``hello``, ``up`` / ``down`` (star exchange), ``model`` (mesh exchange), ``util``
            (coalition scores), ``eval`` (own val / test AUROC), ``bye``.
        round: round index (-1 before round 1).
        sender: global index of the sending center.
        body: JSON-able header fields.
        arrays: ``{name: tensor}`` (float32, float64, int64, or bfloat16 sent as its 16 bits).
    """

    kind: str
    round: int
    sender: int
    body: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, torch.Tensor] = field(default_factory=dict)

    def payload_bytes(self) -> int:
        """Bytes of the arrays (what the ledger counts for a model message)."""
        return sum(t.numel() * t.element_size() for t in self.arrays.values())


def encode(msg: Message) -> bytes:
    """``[4-byte header length][JSON header][array bytes...]``; bfloat16 arrays travel as 2 bytes a value."""
    specs, blobs = [], []
    for name, t in msg.arrays.items():
        t = t.detach().contiguous().cpu()
        if t.dtype == torch.bfloat16:
            arr, dtype = t.view(torch.int16).numpy().view(np.uint16), "bfloat16"
        else:
            arr = t.numpy()
            dtype = str(arr.dtype)
            if dtype not in _DTYPES:
                raise MessageError(f"array {name!r}: dtype {dtype} cannot be sent")
        specs.append({"name": name, "dtype": dtype, "shape": list(t.shape)})
        blobs.append(arr.tobytes())
    head = json.dumps({"kind": msg.kind, "round": msg.round, "sender": msg.sender, "body": msg.body,
                       "arrays": specs}, separators=(",", ":")).encode()
    return struct.pack("<I", len(head)) + head + b"".join(blobs)


def decode(data: bytes) -> Message:
    """Parse :func:`encode`'s output.

    Raises:
        MessageError: truncated data, bad JSON, an unknown dtype or sizes that do not add up.
    """
    try:
        (hlen,) = struct.unpack_from("<I", data, 0)
        head = json.loads(data[4 : 4 + hlen])
        off = 4 + hlen
        arrays = {}
        for spec in head["arrays"]:
            dt = np.dtype(_DTYPES[spec["dtype"]])
            shape = [int(s) for s in spec["shape"]]
            count = int(np.prod(shape)) if shape else 1
            end = off + count * dt.itemsize
            if end > len(data):
                raise MessageError("message shorter than its arrays")
            arr = np.frombuffer(data[off:end], dtype=dt).reshape(shape).copy()
            t = torch.from_numpy(arr)
            arrays[str(spec["name"])] = t.view(torch.bfloat16) if spec["dtype"] == "bfloat16" else t
            off = end
        if off != len(data):
            raise MessageError("message longer than its arrays")
        return Message(str(head["kind"]), int(head["round"]), int(head["sender"]), dict(head["body"]), arrays)
    except MessageError:
        raise
    except Exception as exc:  # noqa: BLE001 - any malformed input is one error
        raise MessageError(f"malformed message ({exc.__class__.__name__})") from None
