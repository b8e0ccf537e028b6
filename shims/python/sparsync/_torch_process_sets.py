"""Horovod's process sets for sparsync.torch.

A process set is a subset of the job's ranks whose collectives involve those ranks alone. Every
rank adds the same sets in the same order (hvd.init(process_sets=[...]), then
hvd.add_process_set), so a set's id (1, 2, ... in that order; 0 is the global set) is the same
on every rank. Ids are never reused within a job, also after remove_process_set.

How a collective on a set reaches the daemon: its tensor is registered with the set's global
ranks as members (`Client.register(..., members=ranks)`); only the members register and post
it, and the daemon completes it when every member has posted, never waiting for the others. Its
name is put in the set's namespace (``"ps<id>/" + name``; unnamed ops count per set), because
the daemon knows a tensor by its name across the whole job. Cost: the daemons of every node take
part in a set's exchange, those without a member with zeros, so a set's collective moves as many
bytes as a global one; only the waiting is the set's.

The global set is none of this: its collectives register with members=None, as before process
sets existed.
"""

import operator

from sparsync import _wire as W

_PREFIX = "ps%d/"


class ProcessSet:
    """A set of global ranks (Horovod's class): ``hvd.ProcessSet([0, 2])``. It is usable once
    added (hvd.add_process_set or hvd.init(process_sets=...)), which gives it its
    process_set_id."""

    def __init__(self, ranks_or_comm):
        if isinstance(ranks_or_comm, (str, bytes)) or not hasattr(ranks_or_comm, "__iter__"):
            raise ValueError("ProcessSet should be initialized with a list of process ranks "
                             "(sparsync has no MPI communicators), got %r" % (ranks_or_comm,))
        try:
            ranks = sorted(operator.index(r) for r in ranks_or_comm)
        except TypeError:
            raise ValueError("ProcessSet should be initialized with a list of process ranks "
                             "(integers), got %r" % (ranks_or_comm,)) from None
        if len(set(ranks)) != len(ranks):
            raise ValueError("ProcessSet ranks must be distinct, got %r" % (ranks,))
        self.ranks = ranks
        self.process_set_id = None
        self.mpi_comm = None

    def _members(self):
        return self.ranks

    def size(self):
        """The number of ranks in the set (None when it has not been added)."""
        if self.process_set_id is None:
            return None
        return len(self._members())

    def rank(self):
        """This process's rank within the set: its index among the set's global ranks (None when
        the set has not been added). ValueError when this process is not a member, as Horovod.
        Collectives still take global ranks (broadcast's root_rank)."""
        if self.process_set_id is None:
            return None
        me = _world_rank()
        members = self._members()
        if me not in members:
            raise ValueError("Process is not part of provided process set: rank %d is not in %s"
                             % (me, self))
        return members.index(me)

    def included(self):
        """Whether this process is a member (None when the set has not been added)."""
        if self.process_set_id is None:
            return None
        return _world_rank() in self._members()

    def _invalidate(self):
        self.process_set_id = None

    def __str__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s, mpi_comm=None)" % (
            self.process_set_id, self.ranks)

    __repr__ = __str__


class _GlobalProcessSet(ProcessSet):
    """hvd.global_process_set: every rank of the job (ranks is [] before hvd.init(), as
    Horovod's)."""

    def __init__(self):
        self.process_set_id = 0
        self.mpi_comm = None

    @property
    def ranks(self):
        from sparsync._torch_state import state

        return [] if state.world is None else list(range(state.world["size"]))

    def _members(self):
        from sparsync._torch_state import client

        return list(range(client().world["size"]))

    def _invalidate(self):
        pass  # the global set is never removed


global_process_set = _GlobalProcessSet()

_sets = {}       # id -> the added ProcessSet (ids >= 1)
_next_id = [1]   # the id the next added set gets


def _world_rank():
    from sparsync._torch_state import client

    return client().world["rank"]


def _world_size():
    from sparsync._torch_state import client

    return client().world["size"]


def _add(process_set):
    """Registers `process_set` (a ProcessSet or ranks) under the next id; returns it."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set is global_process_set:
        raise ValueError("Attempted to add a duplicate process set: the global process set")
    if process_set.process_set_id is not None and _sets.get(process_set.process_set_id) \
            is process_set:
        raise ValueError("Attempted to add a duplicate process set: %s was already added"
                         % process_set)
    n = _world_size()
    ranks = process_set.ranks
    bad = [r for r in ranks if not 0 <= r < n]
    if bad:
        raise ValueError("process set %s: ranks %s are not ranks of this job (size %d)"
                         % (ranks, bad, n))
    if not ranks or ranks == list(range(n)):
        raise ValueError("Attempted to add a duplicate process set: %s has the ranks of the "
                         "global process set" % (ranks,))
    if ranks[-1] >= W.MAX_SET_RANKS:
        raise ValueError("process set %s: sparsync's process sets hold global ranks below %d"
                         % (ranks, W.MAX_SET_RANKS))
    for other in _sets.values():
        if other.ranks == ranks:
            raise ValueError("Attempted to add a duplicate process set: %s has the ranks of %s"
                             % (ranks, other))
    process_set.process_set_id = _next_id[0]
    _next_id[0] += 1
    _sets[process_set.process_set_id] = process_set
    return process_set


def init_process_sets(process_sets):
    """hvd.init(process_sets=...): None, "dynamic" (accepted: sets may always be added later),
    or a list of ProcessSets or rank lists, added in order (ids 1, 2, ...). A duplicate raises
    ValueError, as Horovod's init does."""
    if process_sets is None or (isinstance(process_sets, str)
                                and process_sets.lower() == "dynamic"):
        return
    if isinstance(process_sets, (ProcessSet, str, bytes)) or \
            not hasattr(process_sets, "__iter__"):
        raise ValueError("process_sets must be a list of hvd.ProcessSet (or of rank lists), or "
                         "\"dynamic\", got %r" % (process_sets,))
    for index, ps in enumerate(list(process_sets)):
        try:
            _add(ps)
        except ValueError as e:
            raise ValueError("process_sets entry number %d: %s" % (index, e)) from None


def reset():
    """hvd.shutdown(): every added set is forgotten (and invalidated), with its unnamed-op
    counters; ids start again at 1."""
    from sparsync._torch_state import state

    for ps in _sets.values():
        ps._invalidate()
    _sets.clear()
    _next_id[0] = 1
    for key in [k for k in state.noname if isinstance(k, tuple)]:
        del state.noname[key]


def add_process_set(process_set):
    """Adds a process set (a ProcessSet or a list of global ranks) and returns it, with its
    process_set_id. Every rank, members or not, must add the same sets in the same order (the
    ids must agree). A set with the ranks of one already added, or of the global set, raises
    ValueError, as Horovod's does."""
    with _lock():
        return _add(process_set)


def remove_process_set(process_set):
    """Removes an added set: True when it was removed; False for the global set or a set that
    is not added. Its tensors' registrations are released; every rank should remove it (as in
    Horovod), and it must have no collective in flight."""
    if not isinstance(process_set, ProcessSet) or process_set is global_process_set:
        return False
    with _lock():
        ps_id = process_set.process_set_id
        if ps_id is None or _sets.get(ps_id) is not process_set:
            return False
        del _sets[ps_id]
        process_set._invalidate()
        _release_names(ps_id)
        return True


def _lock():
    from sparsync._torch_state import state

    return state.lock


def _release_names(ps_id):
    """Unregisters the kept registrations of set `ps_id` and forgets its unnamed-op counters."""
    from sparsync._torch_state import state

    prefix = _PREFIX % ps_id
    for key in [k for k in state.named if k[1].startswith(prefix)]:
        reg = state.named.pop(key)
        if state.client is not None:
            state.client.unregister(reg)
    for key in [k for k in state.noname if isinstance(k, tuple) and k[0] == ps_id]:
        del state.noname[key]


def resolve(process_set, what="this collective"):
    """The set a collective runs on: None for the global set (today's path, members=None), else
    the added ProcessSet, of which this rank is a member. ValueError otherwise, before anything
    reaches the daemon, naming this rank and the set."""
    if process_set is None or process_set is global_process_set:
        return None
    if not isinstance(process_set, ProcessSet):
        raise TypeError("process_set must be an hvd.ProcessSet (see hvd.add_process_set), got %r"
                        % (process_set,))
    ps_id = process_set.process_set_id
    if ps_id == 0:
        return None
    if ps_id is None:
        # A set made but not added (e.g. ProcessSet([1, 2]) after hvd.init(process_sets=[[1, 2]])):
        # the added set with its ranks, if any.
        if process_set.ranks == list(range(_world_size())):
            return None
        process_set = next((s for s in _sets.values() if s.ranks == process_set.ranks),
                           process_set)
        ps_id = process_set.process_set_id
    if ps_id is None or _sets.get(ps_id) is not process_set:
        raise ValueError("%s: process set %s has not been added (hvd.add_process_set, or "
                         "hvd.init(process_sets=...)), or was removed" % (what, process_set))
    me = _world_rank()
    if me not in process_set.ranks:
        raise ValueError("%s: rank %d is not a member of process set %s; only its members may "
                         "call collectives on it" % (what, me, process_set))
    return process_set


def members(ps):
    """The `members` argument of Client.register for a resolved set (None: the global set)."""
    return None if ps is None else list(ps.ranks)


def set_size(ps):
    return _world_size() if ps is None else len(ps.ranks)


def set_rank(ps):
    return _world_rank() if ps is None else ps.ranks.index(_world_rank())


def full_name(ps, name):
    """The name the daemon knows a set's tensor by (the global set's: `name` itself)."""
    return name if ps is None else (_PREFIX % ps.process_set_id) + name


def check_root(ps, root_rank):
    """A broadcast's root_rank is a global rank, and a member of the set (Horovod's)."""
    root = int(root_rank)
    n = _world_size()
    if ps is None:
        if not 0 <= root < n:
            raise ValueError("root_rank %d is not a rank of this job (size %d)" % (root, n))
    elif root not in ps.ranks:
        raise ValueError("root_rank %d is not a member of process set %s (root_rank is a global "
                         "rank of the set)" % (root, ps))
    return root
