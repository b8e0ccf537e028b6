"""Horovod's process sets for sparsync.torch: the global set only.

A process set in Horovod is a subset of ranks with its own collectives and schedule. sparsyncd
negotiates every tensor among all nodes and has no notion of a subset (its plans, merge groups
and exchanges span the whole job), so a real subset needs the daemon to keep one schedule per
set. Until it does, `global_process_set` works wherever Horovod takes a process set, and
`add_process_set` of any other set raises NotImplementedError saying so.
"""


class ProcessSet:
    """A set of ranks (Horovod's class). Only the set of all ranks can be used."""

    def __init__(self, ranks_or_comm=None):
        if ranks_or_comm is not None and not hasattr(ranks_or_comm, "__iter__"):
            raise NotImplementedError("sparsync has no MPI: a ProcessSet is a list of ranks")
        self.ranks = None if ranks_or_comm is None else sorted(int(r) for r in ranks_or_comm)
        self.process_set_id = None

    def _all_ranks(self):
        from sparsync import torch as hvd

        return list(range(hvd.size()))

    def is_global(self):
        return self.ranks is None or self.ranks == self._all_ranks()

    def size(self):
        return len(self._all_ranks() if self.ranks is None else self.ranks)

    def rank(self):
        """This process's rank within the set (None when it is not a member)."""
        from sparsync import torch as hvd

        members = self._all_ranks() if self.ranks is None else self.ranks
        return members.index(hvd.rank()) if hvd.rank() in members else None

    def included(self):
        return self.rank() is not None

    def __repr__(self):
        return "ProcessSet(process_set_id=%r, ranks=%r)" % (self.process_set_id, self.ranks)


global_process_set = ProcessSet()
global_process_set.process_set_id = 0


def _not_implemented(ranks):
    return NotImplementedError(
        "process set %s: sparsync supports only the global process set (every rank); the daemon "
        "negotiates and exchanges every tensor among all nodes and has no per-subset schedule. "
        "Use hvd.global_process_set, or run one job per subset" % (ranks,))


def add_process_set(process_set):
    """Horovod's add_process_set: the global set is returned as is; any other subset raises."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.is_global():
        return global_process_set
    raise _not_implemented(process_set.ranks)


def remove_process_set(process_set):
    """Removing the global set is refused in Horovod too; no other set can exist here."""
    return False


def check_global(process_set, where):
    """Raises unless `process_set` is the global set (or None)."""
    if process_set is None or process_set is global_process_set:
        return
    if isinstance(process_set, ProcessSet) and process_set.is_global():
        return
    ranks = process_set.ranks if isinstance(process_set, ProcessSet) else process_set
    raise _not_implemented(ranks)
