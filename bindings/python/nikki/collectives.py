"""nki.collectives: communication between NeuronCores (ranks) of a replica group.

nikki simulates one NeuronCore, so it is always rank 0 of a one-rank world. A collective over a
replica group of that one rank has a single-core meaning, which nikki implements: every rank's
contribution is its own, so ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``
and a permutation that sends rank 0 to itself copy each source into its destination. Any group
of more than one rank needs other cores and raises NotImplementedError naming the collective.
"""

from __future__ import annotations

from . import isa

__all__ = [
    "ReplicaGroup", "rank_id", "all_reduce", "all_gather", "all_gather_v", "reduce_scatter", "all_to_all",
    "all_to_all_v", "collective_permute", "collective_permute_implicit", "collective_permute_implicit_reduce",
    "collective_permute_implicit_current_processing_rank_id",
]


class ReplicaGroup:
    """A group of ranks that take part in a collective: ``ReplicaGroup([[0, 1], [2, 3]])`` or a flat
    list of ranks."""

    def __init__(self, replica_groups=None, **kwargs):
        groups = replica_groups if replica_groups is not None else kwargs.get("groups", [[0]])
        groups = [list(g) if isinstance(g, (list, tuple)) else [g] for g in groups]
        if groups and all(len(g) == 1 for g in groups) and len(groups) > 1:
            groups = [[g[0] for g in groups]]  # a flat list of ranks is one group
        self.replica_groups = groups

    @property
    def group_size(self) -> int:
        return len(self.replica_groups[0]) if self.replica_groups else 1

    def __repr__(self) -> str:
        return f"ReplicaGroup({self.replica_groups})"


def rank_id() -> int:
    """This core's rank: 0, nikki's only NeuronCore."""
    return 0


def _single_rank(name: str, replica_group) -> None:
    size = replica_group.group_size if isinstance(replica_group, ReplicaGroup) else len(replica_group or [0])
    if size != 1:
        raise NotImplementedError(f"nki.collectives.{name} over {size} ranks is not supported by nikki, which "
                                  "simulates one NeuronCore (a one-rank replica group works; see "
                                  "docs/api-coverage.md)")


def _copy_each(name: str, srcs, dsts) -> None:
    srcs = list(srcs) if isinstance(srcs, (list, tuple)) else [srcs]
    dsts = list(dsts) if isinstance(dsts, (list, tuple)) else [dsts]
    if len(srcs) != len(dsts):
        raise ValueError(f"nki.collectives.{name}: {len(srcs)} sources but {len(dsts)} destinations")
    for src, dst in zip(srcs, dsts):
        isa.dma_copy(dst=dst, src=src)


def all_reduce(srcs, dsts, replica_group, op=None, priority=None, name=None):
    """dst = op over ranks of src: src itself on one rank."""
    _single_rank("all_reduce", replica_group)
    _copy_each("all_reduce", srcs, dsts)


def all_gather(srcs, dsts, replica_group, collective_dim=0, priority=None, name=None):
    """dst = the ranks' srcs concatenated along collective_dim: src itself on one rank."""
    _single_rank("all_gather", replica_group)
    _copy_each("all_gather", srcs, dsts)


def reduce_scatter(srcs, dsts, replica_group, collective_dim=0, op=None, priority=None, name=None):
    """dst = this rank's slice of the reduction over ranks: src itself on one rank."""
    _single_rank("reduce_scatter", replica_group)
    _copy_each("reduce_scatter", srcs, dsts)


def all_to_all(srcs, dsts, replica_group, collective_dim=0, priority=None, name=None):
    """Rank r's slice k goes to rank k's slice r: src itself on one rank."""
    _single_rank("all_to_all", replica_group)
    _copy_each("all_to_all", srcs, dsts)


def collective_permute(srcs, dsts, source_target_pairs, priority=None, name=None):
    """Each (source, target) rank pair sends source's src to target's dst."""
    pairs = [tuple(p) for p in source_target_pairs]
    if any(p != (0, 0) for p in pairs):
        raise NotImplementedError(f"nki.collectives.collective_permute with pairs {pairs} is not supported by nikki, "
                                  "which simulates one NeuronCore (rank 0)")
    if pairs:
        _copy_each("collective_permute", srcs, dsts)


def _multi_core_only(name: str):
    def fn(*args, **kwargs):
        raise NotImplementedError(f"nki.collectives.{name} is not supported by nikki, which simulates one "
                                  "NeuronCore (see docs/api-coverage.md)")

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"nki.collectives.{name}: needs several NeuronCores; raises NotImplementedError in nikki."
    return fn


# Variable-size and channel-based collectives carry metadata tensors and channel schedules that
# only mean something between cores.
all_gather_v = _multi_core_only("all_gather_v")
all_to_all_v = _multi_core_only("all_to_all_v")
collective_permute_implicit = _multi_core_only("collective_permute_implicit")
collective_permute_implicit_reduce = _multi_core_only("collective_permute_implicit_reduce")
collective_permute_implicit_current_processing_rank_id = _multi_core_only(
    "collective_permute_implicit_current_processing_rank_id")
