"""The model runner: owns the paged KV pool, turns a scheduled step into batch tensors, runs the forward
pass and samples. A step lays out prefill chunks (`StepSeq`s, `paged_prefill`) then one-token rows
(`DecodeRows`, `paged_decode`); only sampling positions are projected to logits.
NOTE: a step never mutates a `SamplingState`'s history: the engine appends accepted tokens before the
next step.
"""

from __future__ import annotations

import contextlib
import operator
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import torch

from radixd import kernels
from radixd.daemon.executor.draft_sampling import verify_sampled
from radixd.daemon.executor.limits import check_token_ids
from radixd.daemon.executor.masks import PendingMasks, StepMasks
from radixd.daemon.executor.prompt_logprobs import PromptLogprobs, score_chunk
from radixd.daemon.executor.sampling import SampleResult, SamplingState, sample
from radixd.daemon.model import AttentionMetadata, KVLayout, LlamaModel, ModelConfig
from radixd.daemon.model.layer import GroupTables
from radixd.daemon.process.host import configure_threads, zeros_on_huge_pages


@dataclass(slots=True)
class StepSeq:
    """One running sequence's share of a step."""

    seq_id: int
    token_ids: list[int]  # tokens to compute now: a prefill chunk, or 1 token when decoding
    start_pos: int  # tokens of this sequence already in KV (position of token_ids[0])
    block_table: Sequence[int]  # physical blocks covering [0, start_pos + len(token_ids)); array('i')
    sample: SamplingState | None  # None for a non-final prefill chunk (compute KV only)
    # Set while the request scores its prompt: the chunk's positions are scored into it (`run`).
    prompt_logprobs: PromptLogprobs | None = None
    # Speculative decoding: the last `draft` tokens are proposals to verify; `sample` then samples
    # after each of the last draft + 1 positions (engine/speculative.py), each row as its own step.
    draft: int = 0
    # The windowed layout's sliding tables (kv_layout.py), one per sliding group, each as long as
    # block_table; entries of blocks wholly left of the window of start_pos may be 0 (released).
    window_tables: Sequence[Sequence[int]] = ()


StepResult = SampleResult | list[SampleResult] | None
"""What `ModelRunner.run` gives a row: its sample, None (no sampling), or, for a drafted chunk, the
sample after each of its last draft + 1 positions, in order."""


@dataclass(slots=True)
class DecodeRows:
    """A step's one-token rows as columns (no `StepSeq` object per decoding sequence)."""

    seq_ids: list[int]
    token_ids: list[int]  # the token each row computes now
    positions: list[int]  # its position (tokens already in KV)
    tables: list[Sequence[int]]  # physical blocks covering [0, position]; array('i')
    samples: list[SamplingState | None]  # None: compute KV only (a root's last prompt token, a chunk)
    # Each row's sliding tables (`StepSeq.window_tables`); [] (no column) where no row has any.
    window_tables: list[Sequence[Sequence[int]]] = field(default_factory=list)

    @classmethod
    def of(cls, seqs: Sequence[StepSeq]) -> DecodeRows:
        """The rows of one-token `StepSeq`s."""
        return cls(
            [s.seq_id for s in seqs],
            [s.token_ids[0] for s in seqs],
            [s.start_pos for s in seqs],
            [s.block_table for s in seqs],
            [s.sample for s in seqs],
            [s.window_tables for s in seqs],
        )

    def __post_init__(self) -> None:
        n = len(self.seq_ids)
        if not len(self.token_ids) == len(self.positions) == len(self.tables) == len(self.samples) == n:
            raise ValueError("DecodeRows: every column needs one entry per row")
        if self.window_tables and len(self.window_tables) != n:
            raise ValueError("DecodeRows: window_tables needs one entry per row (or none at all)")

    def __len__(self) -> int:
        return len(self.seq_ids)

    def row(self, i: int) -> StepSeq:
        """Row `i` as a `StepSeq` (for the per-row checks, which name its sequence)."""
        windows = self.window_tables[i] if self.window_tables else ()
        return StepSeq(
            self.seq_ids[i],
            [self.token_ids[i]],
            self.positions[i],
            self.tables[i],
            self.samples[i],
            window_tables=windows,
        )


def kv_bytes_per_block(
    config: ModelConfig, block_size: int, dtype: torch.dtype, layout: KVLayout | None = None
) -> int:
    """Bytes one block id takes in every lane of `layout` (None: the full layout, a lane a layer), K and V."""
    elem = torch.empty((), dtype=dtype).element_size()
    lanes = config.num_layers if layout is None else layout.lanes
    return 2 * lanes * block_size * config.num_kv_heads * config.head_dim * elem


def num_blocks_for_budget(
    config: ModelConfig,
    block_size: int,
    budget_bytes: int,
    dtype: torch.dtype,
    layout: KVLayout | None = None,
) -> int:
    """How many blocks (block 0, the null block, included) of `layout` fit in `budget_bytes`."""
    n = budget_bytes // kv_bytes_per_block(config, block_size, dtype, layout)
    if n < 2:
        raise ValueError(
            f"a KV budget of {budget_bytes} bytes holds {n} blocks of {block_size} tokens; need at least 2"
        )
    return int(n)


def copy_waves(ops: list[tuple[int, int, int]]) -> list[list[tuple[int, int, int]]]:
    """Split copy ops into order-preserving batches free of read/write conflicts (a call runs in parallel)."""
    waves: list[list[tuple[int, int, int]]] = []
    written: set[int] = set()
    read: set[int] = set()
    for op in ops:
        # A new wave when this op reads a block written earlier in the wave, or writes one read earlier.
        if not waves or op[0] in written or op[1] in read or op[1] in written:
            waves.append([])
            written, read = set(), set()
        waves[-1].append(op)
        written.add(op[1])
        read.add(op[0])
    return waves


class ModelRunner:
    """Runs steps of a `LlamaModel` against a paged KV pool: `k_caches` / `v_caches`, one per lane of
    `layout` (kv_layout.py; the full layout: one per layer). A block id names a block in every lane."""

    def __init__(
        self,
        model: LlamaModel,
        num_blocks: int,
        block_size: int,
        device: str = "cpu",
        dtype: torch.dtype | None = None,
        layout: KVLayout | None = None,
    ) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        configure_threads()
        self.model = model
        self.config = model.config
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.device = torch.device(device)
        self.dtype = dtype or model.kv_dtype
        cfg = self.config
        self.layout = layout or KVLayout.full(cfg)
        if self.layout.num_layers != cfg.num_layers:
            raise ValueError(
                f"a KV layout of {self.layout.num_layers} layers for a {cfg.num_layers}-layer model"
            )
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.k_caches = [self._pool(shape) for _ in range(self.layout.lanes)]
        self.v_caches = [self._pool(shape) for _ in range(self.layout.lanes)]
        # What the model reads: each layer's lane.
        self._layer_k = [self.k_caches[lane] for lane in self.layout.layer_lane]
        self._layer_v = [self.v_caches[lane] for lane in self.layout.layer_lane]
        self.kv_bytes_per_block = kv_bytes_per_block(cfg, block_size, self.dtype, self.layout)
        if kernels.host_kernels(self.device):
            # The compiled CPU attention builds (once per machine) now, not inside the first request.
            kernels.cpu_attention_design()
        self._step_masks: StepMasks | None = None  # built on the first step with a constrained row

    def _pool(self, shape: tuple[int, ...]) -> torch.Tensor:
        """One lane's K or V pool, zeroed; on the host path in 2 MiB pages where the OS lends them."""
        if kernels.host_kernels(self.device):
            return zeros_on_huge_pages(shape, self.dtype)
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def copy_blocks(self, ops: Sequence[tuple[int, int, int]]) -> None:
        """Apply copy-on-write copies (src_block, dst_block, n_tokens) in every lane, in order."""
        for src, dst, n in ops:
            if not (0 <= src < self.num_blocks and 0 <= dst < self.num_blocks):
                raise ValueError(f"copy op ({src}, {dst}, {n}) names a block outside [0, {self.num_blocks})")
            if not 0 <= n <= self.block_size:
                raise ValueError(f"copy op ({src}, {dst}, {n}): n_tokens must be in [0, {self.block_size}]")
        for wave in copy_waves(list(ops)):
            t = torch.tensor(wave, dtype=torch.int64, device=self.device)
            kernels.copy_blocks(self.k_caches, self.v_caches, self.k_caches, self.v_caches, t)

    def _check(self, s: StepSeq) -> int:
        """Checks of one sequence (block ids: in `_tables`); -> blocks its positions need."""
        if not s.token_ids:
            raise ValueError(f"sequence {s.seq_id}: token_ids is empty")
        if s.start_pos < 0:
            raise ValueError(f"sequence {s.seq_id}: start_pos must be >= 0, got {s.start_pos}")
        end = s.start_pos + len(s.token_ids)
        need = -(-end // self.block_size)
        if len(s.block_table) < need:
            raise ValueError(
                f"sequence {s.seq_id}: {len(s.block_table)} blocks cannot hold {end} tokens "
                f"(need {need} of {self.block_size})"
            )
        k = self.layout.sliding_groups
        if len(s.window_tables) != k or any(len(t) < need for t in s.window_tables):
            raise ValueError(
                f"sequence {s.seq_id}: needs {k} sliding tables of >= {need} blocks, got lengths "
                f"{[len(t) for t in s.window_tables]}"
            )
        return need

    def _released(self, start_pos: int) -> int:
        """Leading blocks a sliding table may hold as 0 for a row whose first query is at `start_pos`:
        those whose every token is left of that query's window."""
        return max(0, (start_pos - self.layout.window + 1) // self.block_size)

    def _decode_needs(self, rows: DecodeRows) -> list[int]:
        """Blocks each decode row needs: `_check` over all rows at once (per row only on failure)."""
        if not rows.positions:
            return []
        bs = self.block_size
        needs = [p // bs + 1 for p in rows.positions]
        if (
            min(rows.positions) < 0
            or not all(map(operator.ge, map(len, rows.tables), needs))
            or not (self._windows_fit(rows, needs))
        ):
            for i in range(len(rows.seq_ids)):
                self._check(rows.row(i))
        return needs

    def _windows_fit(self, rows: DecodeRows, needs: list[int]) -> bool:
        """Whether every row has the layout's sliding tables, each covering its position."""
        k = self.layout.sliding_groups
        if not k:
            return not any(rows.window_tables)
        if len(rows.window_tables) != len(needs):
            return False
        return all(
            len(wts) == k and all(len(t) >= n for t in wts)
            for wts, n in zip(rows.window_tables, needs, strict=True)
        )

    def _check_ids(self, chunks: Sequence[StepSeq], rows: DecodeRows, ids: list[int]) -> None:
        """Every token id of the step in [0, vocab), in one pass (the offender named on failure)."""
        try:
            packed = array("q", ids)  # C-speed type check: a float, str or huge id raises here
        except (TypeError, OverflowError):
            packed = array("q")
        if len(packed) == len(ids) and ids and min(packed) >= 0 and max(packed) < self.config.vocab_size:
            return
        vocab = self.config.vocab_size
        for s in chunks:
            check_token_ids(s.token_ids, vocab, what=f"sequence {s.seq_id}:")
        for sid, tok in zip(rows.seq_ids, rows.token_ids, strict=True):
            check_token_ids([tok], vocab, what=f"sequence {sid}:")

    def _tables(
        self,
        tables: Sequence[Sequence[int]],
        needs: Sequence[int],
        seq_ids: list[int],
        released: Sequence[int] = (),
    ) -> torch.Tensor:
        """The rows' block tables as one int32 tensor padded with block 0; ValueError on a bad block id.
        `released` (sliding tables): per row, how many leading entries may be 0."""
        if not tables:
            return torch.zeros((0, 1), dtype=torch.int32)
        width = max(needs)
        rows = len(tables)
        lens = list(map(len, tables))
        t: torch.Tensor | None = None
        if lens == needs:
            # Every row needs its whole table: one join of the packed tables and zero pads, no
            # slice or extend per row.
            zeros = memoryview(bytes(4 * width))
            parts: list[object] = []
            for table, n in zip(tables, lens, strict=True):
                parts.append(table)
                if n < width:
                    parts.append(zeros[: 4 * (width - n)])
            try:
                joined = bytearray(b"".join(parts))  # type: ignore[arg-type]
            except TypeError:  # a table of Python ints (tests, offline callers)
                joined = bytearray()
            if len(joined) == 4 * rows * width:  # else not int32 tables: built below
                t = torch.frombuffer(joined, dtype=torch.int32).view(rows, width)
        if t is None:
            buf = array("i")
            for table, need in zip(tables, needs, strict=True):
                # The engine's tables are array('i'): slicing copies packed ints, no Python int per block.
                buf.extend(table[:need])
                if need < width:
                    buf.frombytes(bytes(buf.itemsize * (width - need)))
            t = torch.frombuffer(buf, dtype=torch.int32).view(rows, width).clone()
        pads = rows * width - sum(needs)
        zero = t == 0
        if released:
            # The released entries' zeros are fine; every other one must be a pad.
            cols = torch.arange(width).unsqueeze(0)
            zero &= cols >= torch.tensor(released, dtype=torch.int64).unsqueeze(1)
        if int(t.min()) < 0 or int(t.max()) >= self.num_blocks or int(zero.sum()) != pads:
            n = self.num_blocks
            for i, (table, need, sid) in enumerate(zip(tables, needs, seq_ids, strict=True)):
                free = released[i] if released else 0
                if any(not 0 <= b < n for b in table[:free]) or any(not 0 < b < n for b in table[free:need]):
                    what = "block table" if not released else f"sliding table (0 allowed in its first {free})"
                    raise ValueError(f"sequence {sid}: {what} {list(table[:need])} has ids outside [1, {n})")
        return t

    def _forward(self, chunks: Sequence[StepSeq], rows: DecodeRows) -> tuple[torch.Tensor, list[int]]:
        """Run the forward pass over `chunks` then `rows`; -> (hidden [T, H], each one's last row)."""
        bs = self.block_size
        needs = [self._check(s) for s in chunks]
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        last: list[int] = []
        cu = [0]
        for s in chunks:
            ids.extend(s.token_ids)
            p = range(s.start_pos, s.start_pos + len(s.token_ids))
            pos.extend(p)
            bt = s.block_table
            slots.extend(bt[q // bs] * bs + q % bs for q in p)
            cu.append(len(ids))
            last.append(len(ids) - 1)
        # Decode rows: one token each, its slot read off the table tensor below.
        dec_needs = self._decode_needs(rows)
        last += range(len(ids), len(ids) + len(rows.token_ids))
        ids += rows.token_ids
        self._check_ids(chunks, rows, ids)
        dec_tables = self._tables(rows.tables, dec_needs, rows.seq_ids)
        dec_positions = torch.tensor(rows.positions, dtype=torch.int64)
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.cat(
                (torch.tensor(slots, dtype=torch.int64), self._slots(dec_tables, dec_positions))
            ).to(dev),
            num_prefill_tokens=cu[-1],
            prefill_block_tables=self._tables(
                [s.block_table for s in chunks], needs, [s.seq_id for s in chunks]
            ).to(dev),
            prefill_cu_q_lens=torch.tensor(cu, dtype=torch.int32).to(dev),
            prefill_seq_lens=torch.tensor(
                [s.start_pos + len(s.token_ids) for s in chunks], dtype=torch.int32
            ).to(dev),
            decode_block_tables=dec_tables.to(dev),
            decode_seq_lens=(dec_positions + 1).to(torch.int32).to(dev),
            max_position=max(max(pos, default=-1), max(rows.positions, default=-1)),
        )
        if self.layout.sliding_groups:
            meta.sliding = self._sliding(chunks, needs, rows, dec_needs, dec_positions)
            meta.layer_group = self.layout.layer_group
        input_ids = torch.tensor(ids, dtype=torch.int64).to(dev)
        positions = torch.cat((torch.tensor(pos, dtype=torch.int64), dec_positions)).to(dev)
        hidden = self.model.forward(input_ids, positions, meta, self._layer_k, self._layer_v)
        return hidden, last

    def _slots(self, tables: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Pool slots of one token per row at `positions` through the rows' `tables`."""
        bs = self.block_size
        slots = tables.gather(1, (positions // bs).unsqueeze(1)).squeeze(1).long() * bs
        return slots + positions % bs

    def _sliding(
        self,
        chunks: Sequence[StepSeq],
        needs: list[int],
        rows: DecodeRows,
        dec_needs: list[int],
        dec_positions: torch.Tensor,
    ) -> tuple[GroupTables, ...]:
        """Each sliding group's tables and slots for the step (checked: a 0 only where released)."""
        bs = self.block_size
        dev = self.device
        chunk_ids = [s.seq_id for s in chunks]
        chunk_free = [self._released(s.start_pos) for s in chunks]
        dec_free = [self._released(p) for p in rows.positions]
        out: list[GroupTables] = []
        for g in range(self.layout.sliding_groups):
            pre = self._tables([s.window_tables[g] for s in chunks], needs, chunk_ids, chunk_free)
            dec = self._tables([w[g] for w in rows.window_tables], dec_needs, rows.seq_ids, dec_free)
            slots: list[int] = []
            for s in chunks:
                t = s.window_tables[g]
                slots.extend(
                    t[q // bs] * bs + q % bs for q in range(s.start_pos, s.start_pos + len(s.token_ids))
                )
            mapping = torch.cat((torch.tensor(slots, dtype=torch.int64), self._slots(dec, dec_positions)))
            out.append(GroupTables(mapping.to(dev), pre.to(dev), dec.to(dev)))
        return tuple(out)

    @torch.inference_mode()
    def run(self, chunks: Sequence[StepSeq], rows: DecodeRows) -> list[StepResult]:
        """Compute a step: `chunks`, then decode `rows`; sample where set, score prompt logprobs, verify
        drafts. -> one result per chunk, then per decode row."""
        if not chunks and not rows.seq_ids:
            return []
        drafted = [i for i, s in enumerate(chunks) if s.draft and s.sample is not None]
        states = [None if s.draft else s.sample for s in chunks] + rows.samples
        drafts = [
            (cast("SamplingState", chunks[i].sample), chunks[i].token_ids[-chunks[i].draft :])
            for i in drafted
        ]
        # Constrained rows: their masks are computed while the forward pass runs (executor/masks.py);
        # a drafted one's at each position it verifies.
        constrained = self._constrained(states) or self._constrained([st for st, _ in drafts])
        masks = self._masks().start(states, drafts) if constrained else None
        try:
            hidden, last = self._forward(chunks, rows)
            for i, s in enumerate(chunks):
                if s.prompt_logprobs is not None:
                    first = last[i] - len(s.token_ids) + 1
                    score_chunk(
                        hidden, first, s.start_pos, len(s.token_ids), s.prompt_logprobs, self.model.logits
                    )
        except BaseException:
            if masks is not None:  # no fill outlives its step (the engine may touch the matchers next)
                with contextlib.suppress(Exception):
                    masks.wait()
            raise
        if None not in states:  # every row samples (a decode step): no row bookkeeping
            idx = torch.tensor(last, dtype=torch.int64, device=self.device)
            logits = self.model.logits(hidden.index_select(0, idx))
            if masks is not None:
                logits = masks.apply(logits)
            return cast("list[StepResult]", sample(logits, cast("list[SamplingState]", states)))
        results: list[StepResult] = [None] * len(states)
        if drafted:
            try:
                self._verify(hidden, last, [chunks[i] for i in drafted], drafted, results, masks)
            except BaseException:
                if masks is not None:  # as above: the drafted matchers are mid-walk until it ends
                    with contextlib.suppress(Exception):
                        masks.wait()
                raise
        sampling = [i for i, st in enumerate(states) if st is not None]
        if not sampling:
            return results
        chosen = [st for st in states if st is not None]
        idx = torch.tensor([last[i] for i in sampling], dtype=torch.int64, device=self.device)
        logits = self.model.logits(hidden.index_select(0, idx))
        if masks is not None:
            logits = masks.apply(logits)
        for i, r in zip(sampling, sample(logits, chosen), strict=True):
            results[i] = r
        return results

    def _verify(
        self,
        hidden: torch.Tensor,
        last: list[int],
        chunks: list[StepSeq],
        where: list[int],
        results: list[StepResult],
        masks: PendingMasks | None,
    ) -> None:
        """Sample each drafted chunk after each of its last draft + 1 positions into `results[where]`.
        NOTE: a greedy row samples exactly as a lone decode step would (row-local projection, sampler)."""
        pos: list[int] = []
        states: list[SamplingState] = []
        for i, s in zip(where, chunks, strict=True):
            assert s.sample is not None
            pos.extend(range(last[i] - s.draft, last[i] + 1))
            states.extend([s.sample] * (s.draft + 1))
        idx = torch.tensor(pos, dtype=torch.int64, device=self.device)
        logits = self.model.logits(hidden.index_select(0, idx))
        if masks is not None:
            logits = masks.apply_drafts(logits)
        greedy = [j for j, st in enumerate(states) if st.params.greedy]
        # An int64 index on the logits' device (an empty list would make a float CPU tensor).
        gidx = torch.tensor(greedy, dtype=torch.int64, device=logits.device)
        picked = sample(logits.index_select(0, gidx), [states[j] for j in greedy]) if greedy else []
        at = g = 0
        for i, s in zip(where, chunks, strict=True):
            st = s.sample
            assert st is not None
            if st.params.greedy:
                results[i] = picked[g : g + s.draft + 1]
                g += s.draft + 1
            else:
                draft = list(s.token_ids[len(s.token_ids) - s.draft :])
                results[i] = verify_sampled(logits[at : at + s.draft + 1], draft, st)
            at += s.draft + 1

    @staticmethod
    def _constrained(states: Sequence[SamplingState | None]) -> bool:
        # The one cost of structured outputs to a step without them: this scan.
        return any(st is not None and st.grammar is not None for st in states)

    def _masks(self) -> StepMasks:
        if self._step_masks is None:
            self._step_masks = StepMasks(self.config.vocab_size)
        return self._step_masks

    def step(self, seqs: Sequence[StepSeq]) -> list[StepResult]:
        """`run` for a list of sequences in any order: one-token ones become decode rows; -> results
        in `seqs` order."""
        chunked = [i for i, s in enumerate(seqs) if len(s.token_ids) != 1]
        decoded = [i for i, s in enumerate(seqs) if len(s.token_ids) == 1]
        res = self.run([seqs[i] for i in chunked], DecodeRows.of([seqs[i] for i in decoded]))
        out: list[StepResult] = [None] * len(seqs)
        for i, r in zip(chunked + decoded, res, strict=True):
            out[i] = r
        return out

    @torch.inference_mode()
    def step_logits(self, seqs: Sequence[StepSeq]) -> torch.Tensor:
        """Like `step` but returns fp32 logits of every new token, in `seqs` order; samples nothing."""
        if not seqs:
            return torch.empty(0, self.config.vocab_size)
        chunked = [i for i, s in enumerate(seqs) if len(s.token_ids) != 1]
        decoded = [i for i, s in enumerate(seqs) if len(s.token_ids) == 1]
        hidden, last = self._forward([seqs[i] for i in chunked], DecodeRows.of([seqs[i] for i in decoded]))
        # Each sequence's rows end at its `last` row, in layout order (chunks, then decode rows).
        where = dict(zip(chunked + decoded, last, strict=True))
        rows = [r for i, s in enumerate(seqs) for r in range(where[i] - len(s.token_ids) + 1, where[i] + 1)]
        return self.model.logits(hidden.index_select(0, torch.tensor(rows, device=self.device)))
