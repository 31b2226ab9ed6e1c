"""How a model's layers share the KV pool: which K/V tensor ("lane") and which block table ("group")
each layer's keys live in.

A pool block id names one block in every lane. The full layout gives every layer its own lane and
all of them the sequence's block table (group 0). The windowed layout (models with both full and
sliding-window layers) has one lane per full layer: the full layers keep group 0, and the sliding
layers are packed `lanes` to a group into `ceil(n_sliding / lanes)` extra tables (groups 1..k) whose
blocks left of the window may be released (their entries 0) while a sequence runs.
NOTE: both layouts hand the same ids out of one pool, so memory moves freely between groups.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixd.daemon.model.config import ModelConfig

KV_LAYOUTS = ("auto", "full", "windowed")
"""The layout modes: "auto" (windowed where the model has both kinds of layers), "full", "windowed"."""


@dataclass(frozen=True)
class KVLayout:
    """Where each layer's K/V lives: lane `layer_lane[l]` of the blocks of group `layer_group[l]`
    (0 = the block table, g >= 1 = sliding table g - 1); `window`: tokens the sliding groups keep."""

    lanes: int
    layer_lane: tuple[int, ...]
    layer_group: tuple[int, ...]
    window: int

    def __post_init__(self) -> None:
        if self.lanes < 1 or len(self.layer_lane) != len(self.layer_group) or not self.layer_lane:
            raise ValueError("KVLayout: lanes >= 1 and one lane and one group per layer")
        if min(self.layer_lane) < 0 or max(self.layer_lane) >= self.lanes or min(self.layer_group) < 0:
            raise ValueError(f"KVLayout: lanes must lie in [0, {self.lanes}) and groups be >= 0")
        if len(set(zip(self.layer_lane, self.layer_group, strict=True))) != len(self.layer_lane):
            raise ValueError("KVLayout: two layers share a (lane, group)")
        if (self.window > 0) != (self.groups > 1):
            raise ValueError("KVLayout: a window exactly when there are sliding groups")

    @property
    def groups(self) -> int:
        """Block tables a sequence holds: its block table and the sliding tables."""
        return 1 + max(self.layer_group)

    @property
    def sliding_groups(self) -> int:
        return self.groups - 1

    @property
    def num_layers(self) -> int:
        return len(self.layer_lane)

    @staticmethod
    def full(cfg: ModelConfig) -> KVLayout:
        """Every layer its own lane, every layer in the block table (the window is attention's only)."""
        n = cfg.num_layers
        return KVLayout(n, tuple(range(n)), (0,) * n, 0)

    @staticmethod
    def windowed(cfg: ModelConfig) -> KVLayout | None:
        """Full layers in group 0, sliding layers packed into sliding groups; None where `why_not` says."""
        if why_not_windowed(cfg):
            return None
        windows = [cfg.window(i) for i in range(cfg.num_layers)]
        lanes = windows.count(0)
        lane: list[int] = []
        group: list[int] = []
        gi = si = 0
        for w in windows:
            if w == 0:
                lane.append(gi)
                group.append(0)
                gi += 1
            else:
                lane.append(si % lanes)
                group.append(1 + si // lanes)
                si += 1
        return KVLayout(lanes, tuple(lane), tuple(group), max(windows))

    @staticmethod
    def choose(cfg: ModelConfig, mode: str) -> KVLayout:
        """The layout of mode `mode` (one of `KV_LAYOUTS`); ValueError for "windowed" on a model it
        does not apply to, naming why."""
        if mode not in KV_LAYOUTS:
            raise ValueError(f"unknown KV layout {mode!r}: use one of {KV_LAYOUTS}")
        if mode == "full":
            return KVLayout.full(cfg)
        layout = KVLayout.windowed(cfg)
        if layout is not None:
            return layout
        if mode == "windowed":
            raise ValueError(f"the windowed KV layout does not apply: {why_not_windowed(cfg)}")
        return KVLayout.full(cfg)


def why_not_windowed(cfg: ModelConfig) -> str:
    """Why the windowed layout does not apply to `cfg` ("" where it does)."""
    windows = [cfg.window(i) for i in range(cfg.num_layers)]
    sliding = {w for w in windows if w > 0}
    if not sliding:
        return "the model has no sliding-window layers"
    if 0 not in windows:
        return "every layer of the model is a sliding-window one (no full-attention layer)"
    if len(sliding) > 1:
        return f"its sliding layers' windows differ ({sorted(sliding)})"
    return ""
