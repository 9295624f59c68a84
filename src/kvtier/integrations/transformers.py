"""Prefix reuse for Hugging Face transformers causal LMs, across turns and across processes.

:class:`PrefixCache` wraps one causal LM and one :class:`kvtier.Engine` (any tier stack). For every
call with token ids it:

1. keys every *full* block of ``block_size`` tokens with kvtier's chained prefix keys, in a namespace
   of the model (a sample of its weights, its config), the KV dtype and layout, the block size and
   the engine's ``cache_salt``; a trailing partial block gets no key, so it is never stored;
2. restores the longest leading run of cached blocks into a fresh ``DynamicCache`` (at most
   ``len(ids) - 1`` tokens, so the model always computes the last token's logits), waiting at most
   ``wait_s`` for blocks being promoted from a secondary tier;
3. runs the model on the remaining tokens only;
4. stores every new full block of the cache the model returned.

Guarantees (``tests/integration/test_hf_prefix_reuse.py``):
    * the output equals a plain forward of the whole sequence up to floating-point reassociation
      (suffix logits within 1e-5 in fp32; greedy ``generate`` gives the same tokens);
    * a cache written for another model, dtype, KV layout or block size is never restored: those
      are in the namespace, so their keys differ;
    * anything kvtier fails at (a tier error, a corrupt block, a closed engine) is logged and
      counted in ``stats()["errors"]``, and the call recomputes: the caller gets the model's output,
      never a kvtier error. Only misuse (bad arguments, an unsupported model) raises
      :class:`~kvtier.errors.MisuseError`, at once and with the fix.

One block's bytes (one primary row) are, layer by layer, its K then its V, each
``(kv_heads, block_size, head_dim)`` in the model's dtype: ``block_bytes_for(model, block_size)``.
torch and transformers are imported when a :class:`PrefixCache` is built, never by ``import kvtier``.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import xxhash

from kvtier.errors import MisuseError
from kvtier.keys import BlockKey, KeyNamespace, make_namespace

if TYPE_CHECKING:
    # The package root, not kvtier.engine: only kvtier.__all__ is stable while the internals move.
    from kvtier import Engine, RequestContext

__all__ = ["PrefixCache", "PrefixForward", "block_bytes_for"]

log = logging.getLogger(__name__)

#: Elements hashed from each end of every parameter for the model's identity: enough to tell two
#: random initialisations or a fine-tune apart, cheap enough for a 70B model on a GPU.
_SAMPLE = 256
#: Keyword arguments the wrapper owns (it builds the cache and the positions itself).
_OWNED = ("cache", "past_key_values", "use_cache", "position_ids", "cache_position", "inputs_embeds")


def _hf() -> tuple[Any, Any]:
    """``(torch, transformers)``, or an ImportError that says which extra to install."""
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise ImportError(
            f"kvtier.integrations.transformers needs torch and transformers ({exc.name} is missing): "
            "pip install 'kvtier[hf]'"
        ) from exc
    return torch, transformers


@dataclass(frozen=True, slots=True)
class _Geometry:
    """The KV layout of one model: what a block's bytes mean."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: Any  # torch.dtype
    itemsize: int
    block_size: int

    @property
    def block_bytes(self) -> int:
        return self.layers * 2 * self.kv_heads * self.block_size * self.head_dim * self.itemsize

    def describe(self) -> str:
        return (
            f"hf-dynamic-cache|rows=layer-major,K-then-V|layers={self.layers}|kv_heads={self.kv_heads}"
            f"|head_dim={self.head_dim}|block_bytes={self.block_bytes}"
        )


def _text_config(model: Any) -> Any:
    cfg = model.config
    get = getattr(cfg, "get_text_config", None)
    return get(decoder=True) if callable(get) else cfg


def _geometry(model: Any, block_size: int) -> _Geometry:
    if int(block_size) < 1:
        raise MisuseError(f"block_size must be >= 1 token, got {block_size}")
    cfg = _text_config(model)
    name = type(model).__name__
    for attr in ("num_hidden_layers", "num_attention_heads", "hidden_size"):
        if not isinstance(getattr(cfg, attr, None), int):
            raise MisuseError(
                f"{name}.config has no integer {attr}; PrefixCache needs a decoder-only causal LM"
            )
    heads = int(cfg.num_attention_heads)
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or int(cfg.hidden_size) // heads
    dtype = model.dtype
    itemsize = int(dtype.itemsize)
    return _Geometry(
        int(cfg.num_hidden_layers), int(kv_heads), int(head_dim), dtype, itemsize, int(block_size)
    )


def block_bytes_for(model: Any, block_size: int = 16) -> int:
    """Bytes of one block of ``block_size`` tokens of ``model``'s KV cache: the engine's ``block_bytes``."""
    _hf()
    return _geometry(model, block_size).block_bytes


def _fingerprint(model: Any) -> str:
    """Hex digest of the model's class, full config and a sample of every parameter's bytes.

    Two processes that built or loaded the same weights agree on it; a different initialisation, a
    fine-tune or a cast to another dtype changes it.
    """
    torch, transformers = _hf()
    h = xxhash.xxh3_128()
    h.update(type(model).__qualname__.encode())
    h.update(model.config.to_json_string(use_diff=False).encode())
    # KV semantics may change between transformers releases (e.g. where RoPE is applied): a block
    # written by one minor version is not trusted by another.
    h.update(".".join(str(transformers.__version__).split(".")[:2]).encode())
    with torch.no_grad():
        for pname, p in model.named_parameters():
            flat = p.detach().reshape(-1)
            if flat.numel() > 2 * _SAMPLE:
                flat = torch.cat([flat[:_SAMPLE], flat[-_SAMPLE:]])
            h.update(f"{pname}|{tuple(p.shape)}|{p.dtype}".encode())
            h.update(flat.contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _cache_keyword(model: Any) -> str:
    """The name ``forward`` takes the KV cache by: ``cache`` (transformers 5) or ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    raise MisuseError(
        f"{type(model).__name__}.forward takes neither cache= nor past_key_values=; "
        "PrefixCache needs a causal LM that accepts a KV cache"
    )


class PrefixForward(NamedTuple):
    """What :meth:`PrefixCache.forward` returns.

    Attributes:
        output: the model's output for tokens ``reused_tokens ..`` of the input: ``output.logits`` has
            ``len(ids) - reused_tokens`` positions (``output.logits[:, -1]`` predicts the next token).
        cache: the ``DynamicCache`` holding the whole sequence (pass it on to continue decoding).
        reused_tokens: leading tokens restored from kvtier instead of computed.
    """

    output: Any
    cache: Any
    reused_tokens: int


class PrefixCache:
    """Prefix reuse for one causal LM on one kvtier :class:`~kvtier.Engine`.

    Args:
        model: a transformers causal LM (``model.eval()``), full attention in every layer.
        engine: an open engine whose ``block_bytes`` equals :func:`block_bytes_for` ``(model,
            block_size)``; :meth:`create` builds one. Several models may share an engine when their
            block bytes agree; their keys never collide.
        block_size: tokens per block; a prompt reuses whole blocks only.
        model_id: optional label mixed into the namespace (e.g. to keep two tokenizers apart).
        request: the :class:`~kvtier.RequestContext` of every engine call (its ``tenant`` scopes keys).
        wait_s: longest wait for blocks being promoted from a secondary tier; after it the rest of
            the prompt is computed.

    Raises :class:`~kvtier.errors.MisuseError` (one line, with the fix) when the model's cache is not
    a full-attention ``DynamicCache`` or the engine's ``block_bytes`` does not fit the model.
    """

    def __init__(
        self,
        model: Any,
        engine: Engine,
        *,
        block_size: int = 16,
        model_id: str = "",
        request: RequestContext | None = None,
        wait_s: float = 2.0,
    ) -> None:
        torch, transformers = _hf()
        self._torch = torch
        self._dynamic_layer = transformers.cache_utils.DynamicLayer
        self._dynamic_cache = transformers.DynamicCache
        self.model = model
        self.engine = engine
        self.request = request
        self.wait_s = float(wait_s)
        self.geometry = _geometry(model, block_size)
        self.block_size = self.geometry.block_size
        if engine.config.primary_backing == "none":
            raise MisuseError(
                "PrefixCache needs an engine with bytes: primary_backing 'none' is simulation only"
            )
        need = self.geometry.block_bytes
        if engine.block_bytes != need:
            raise MisuseError(
                f"engine block_bytes is {engine.block_bytes} but {type(model).__name__} at block_size="
                f"{self.block_size} needs block_bytes={need}; build the engine with that value "
                "(PrefixCache.create does)"
            )
        self._keyword = _cache_keyword(model)
        self._check_cache_layers()
        self.namespace: KeyNamespace = make_namespace(
            f"{model_id}|{_fingerprint(model)}",
            block_size=self.block_size,
            dtype=str(self.geometry.dtype),
            layout=self.geometry.describe(),
            cache_salt=engine.config.cache_salt,
        )
        self.device = next(model.parameters()).device
        self._owns_engine = False
        self._counts: dict[str, int] = dict.fromkeys(
            ("calls", "prompt_tokens", "reused_tokens", "stored_blocks", "skipped_stores", "errors"), 0
        )

    @classmethod
    def create(
        cls,
        model: Any,
        config: Mapping[str, Any] | None = None,
        *,
        block_size: int = 16,
        **options: Any,
    ) -> PrefixCache:
        """A :class:`PrefixCache` on a new engine built from ``config`` (``block_bytes`` filled in).

        The engine is closed by :meth:`close`. ``options`` are the constructor's keyword arguments.
        """
        from kvtier import Engine

        raw = dict(config or {})
        raw.setdefault("block_bytes", block_bytes_for(model, block_size))
        engine = Engine(raw)
        try:
            pc = cls(model, engine, block_size=block_size, **options)
        except BaseException:
            engine.close()
            raise
        pc._owns_engine = True
        return pc

    # -- public calls ------------------------------------------------------------------------
    def forward(self, input_ids: Any, **kwargs: Any) -> PrefixForward:
        """One forward pass over ``input_ids`` (one sequence), reusing its cached prefix.

        ``kwargs`` go to the model (e.g. ``logits_to_keep``); the cache, positions and
        ``use_cache`` are the wrapper's. ``attention_mask`` is refused: one unpadded sequence per call.
        """
        self._refuse(kwargs, allow_mask=False)
        ids = self._as_ids(input_ids)
        tokens = ids[0].cpu().numpy()
        self._poll()
        keys = self.namespace.key_tokens(tokens)
        cache, nblocks = self._restore(keys, len(tokens))
        start = nblocks * self.block_size
        with self._torch.no_grad():
            out = self.model(input_ids=ids[:, start:], use_cache=True, **{self._keyword: cache}, **kwargs)
        self._store(keys, cache, nblocks)
        self._count(len(tokens), start)
        return PrefixForward(out, cache, start)

    def generate(self, input_ids: Any, **kwargs: Any) -> Any:
        """``model.generate`` on ``input_ids`` (one sequence), reusing its cached prefix.

        Returns what ``model.generate`` returns. Afterwards the full blocks of the prompt *and* of the
        generated tokens are stored, so the next turn of a conversation reuses the answer too
        (unless generation ran several sequences, e.g. beams: then nothing is stored).
        """
        torch = self._torch
        self._refuse(kwargs, allow_mask=True)
        ids = self._as_ids(input_ids)
        mask = kwargs.pop("attention_mask", None)
        if mask is not None and (tuple(mask.shape) != tuple(ids.shape) or not bool(mask.bool().all())):
            raise MisuseError("generate: attention_mask must be all ones (padding is not supported); omit it")
        tokens = ids[0].cpu().numpy()
        self._poll()
        keys = self.namespace.key_tokens(tokens)
        cache, nblocks = self._restore(keys, len(tokens))
        out = self.model.generate(
            ids, attention_mask=torch.ones_like(ids), **{self._keyword: cache}, **kwargs
        )
        seqs = out if isinstance(out, torch.Tensor) else out.sequences
        if seqs.shape[0] == 1:
            held = min(int(cache.get_seq_length()), int(seqs.shape[1]))
            self._store(self.namespace.key_tokens(seqs[0, :held].cpu().numpy()), cache, nblocks)
        self._count(len(tokens), nblocks * self.block_size)
        return out

    def stats(self) -> dict[str, float]:
        """Counters of this wrapper, plus ``hit_ratio`` = reused / prompt tokens."""
        out: dict[str, float] = dict(self._counts)
        out["hit_ratio"] = self._counts["reused_tokens"] / max(1, self._counts["prompt_tokens"])
        return out

    def close(self) -> None:
        """Close the engine when :meth:`create` built it (waits for its tier writes); idempotent."""
        if self._owns_engine:
            self.engine.close()

    def __enter__(self) -> PrefixCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- checks ------------------------------------------------------------------------------
    def _check_cache_layers(self) -> None:
        cache = self._new_cache()
        layers = getattr(cache, "layers", None)
        if layers is None:
            version = _hf()[1].__version__
            raise MisuseError(
                f"transformers {version}: DynamicCache has no per-layer objects (.layers); "
                "PrefixCache needs a newer transformers: pip install -U 'kvtier[hf]'"
            )
        for i, layer in enumerate(layers):
            if type(layer) is not self._dynamic_layer:
                raise MisuseError(
                    f"{type(self.model).__name__} layer {i} caches with {type(layer).__name__}; PrefixCache "
                    "supports full-attention layers (DynamicLayer) only"
                )

    def _refuse(self, kwargs: Mapping[str, Any], *, allow_mask: bool) -> None:
        owned = [k for k in kwargs if k in _OWNED or (k == "attention_mask" and not allow_mask)]
        if owned:
            raise MisuseError(
                f"PrefixCache builds {', '.join(owned)} itself; pass only input_ids (one unpadded sequence)"
            )

    def _as_ids(self, input_ids: Any) -> Any:
        torch = self._torch
        ids = input_ids if isinstance(input_ids, torch.Tensor) else torch.as_tensor(np.asarray(input_ids))
        if ids.dim() == 1:
            ids = ids.unsqueeze(0)
        if ids.dim() != 2 or ids.shape[0] != 1:
            raise MisuseError(
                f"input_ids has shape {tuple(ids.shape)}; PrefixCache takes one sequence: "
                "call it once per row"
            )
        if ids.shape[1] == 0:
            raise MisuseError("input_ids is empty; pass at least one token")
        return ids.to(device=self.device, dtype=torch.long)

    # -- kvtier side (failures become recomputation) -------------------------------------------
    def _failed(self, what: str, exc: BaseException) -> None:
        self._counts["errors"] += 1
        log.warning("kvtier: %s failed (%s: %s); recomputing instead", what, type(exc).__name__, exc)

    def _poll(self) -> None:
        # Finished write-through stores keep their slots pinned until polled.
        try:
            self.engine.poll()
        except Exception as exc:
            self._failed("poll", exc)

    def _new_cache(self) -> Any:
        try:
            return self._dynamic_cache(config=self.model.config)
        except TypeError:  # releases whose DynamicCache takes no config
            return self._dynamic_cache()

    def _leading_hits(self, keys: Sequence[BlockKey]) -> int:
        """Leading keys readable in the primary tier, waiting (bounded) for pending promotions."""
        deadline = time.monotonic() + self.wait_s
        delay = 0.0002
        while True:
            report = self.engine.lookup(list(keys), self.request)
            n = int(report.num_hits)
            # Stop at the first MISS: later keys cannot be used without it (prefix chain).
            if n == len(keys) or report.codes[n] == 0 or time.monotonic() >= deadline:
                return n
            self.engine.poll()
            time.sleep(delay)
            delay = min(delay * 2, 0.005)

    def _restore(self, keys: Sequence[BlockKey], ntokens: int) -> tuple[Any, int]:
        """A new cache holding the longest restorable prefix, and its length in blocks."""
        cache = self._new_cache()
        limit = min(len(keys), (ntokens - 1) // self.block_size)
        if limit == 0:
            return cache, 0
        try:
            n = self._leading_hits(keys[:limit])
            if n == 0:
                return cache, 0
            staging = self._torch.empty((n, self.geometry.block_bytes), dtype=self._torch.uint8)
            got = self.engine.load_blocks(keys[:n], staging.numpy(), self.request)
            if got:
                self._fill(cache, staging[:got])
            return cache, got
        except Exception as exc:
            self._failed("restore", exc)
            return self._new_cache(), 0

    def _fill(self, cache: Any, rows: Any) -> None:
        """Append ``rows`` (``(n, block_bytes)`` uint8, the row format above) to an empty cache."""
        g = self.geometry
        n = rows.shape[0]
        typed = rows.view(g.dtype).view(n, g.layers, 2, g.kv_heads, g.block_size, g.head_dim)
        typed = typed.to(self.device, non_blocking=True)
        shape = (1, g.kv_heads, n * g.block_size, g.head_dim)
        for layer in range(g.layers):
            k = typed[:, layer, 0].permute(1, 0, 2, 3).reshape(shape)
            v = typed[:, layer, 1].permute(1, 0, 2, 3).reshape(shape)
            cache.update(k, v, layer)

    def _matching_kv(self, cache: Any, tokens: int) -> list[Any] | None:
        """``[k0, v0, k1, v1, ...]`` of ``cache`` when they are what the namespace promises, else None.

        Each must be a DynamicLayer's ``(1, kv_heads, >= tokens, head_dim)`` tensor of the model dtype.
        """
        g = self.geometry
        layers = getattr(cache, "layers", None)
        if layers is None or len(layers) != g.layers:
            return None
        out: list[Any] = []
        for layer in layers:
            if type(layer) is not self._dynamic_layer:
                return None
            for t in (layer.keys, layer.values):
                if not isinstance(t, self._torch.Tensor) or t.dtype != g.dtype or t.dim() != 4:
                    return None
                b, h, s, d = t.shape
                if b != 1 or h != g.kv_heads or s < tokens or d != g.head_dim:
                    return None
                out.append(t)
        return out

    def _store(self, keys: Sequence[BlockKey], cache: Any, first: int) -> None:
        """Store blocks ``first ..`` of ``keys`` (full blocks of the tokens ``cache`` holds)."""
        n = len(keys) - first
        if n <= 0:
            return
        g = self.geometry
        lo, hi = first * g.block_size, len(keys) * g.block_size
        tensors = self._matching_kv(cache, hi)
        if tensors is None:
            # Storing bytes that do not match the namespace (e.g. autocast changed the KV dtype)
            # would let another process restore wrong values.
            self._counts["skipped_stores"] += 1
            log.warning("kvtier: the model's cache does not match %s; not storing it", g.describe())
            return
        try:
            # (kv_heads, n*bs, head_dim) -> (n, kv_heads, bs, head_dim) are views; stack copies once.
            parts = [
                t[0, :, lo:hi].reshape(g.kv_heads, n, g.block_size, g.head_dim).transpose(0, 1)
                for t in tensors
            ]
            rows = self._torch.stack(parts, dim=1).reshape(n, -1).cpu().view(self._torch.uint8)
            self._counts["stored_blocks"] += self.engine.store_blocks(
                keys[first:], rows.numpy(), self.request
            )
        except Exception as exc:
            self._failed("store", exc)

    def _count(self, prompt: int, reused: int) -> None:
        c = self._counts
        c["calls"] += 1
        c["prompt_tokens"] += prompt
        c["reused_tokens"] += reused
