"""The world accessors each framework's shim exports under Horovod's names: rank(), size(),
local_rank(), local_size(), cross_rank() (the node's rank) and cross_size() (the number of
nodes), read from the shim's state object's `world` (the dict the client library reports; None
before init())."""


def world_accessors(state):
    """(get, rank, size, local_rank, local_size, cross_rank, cross_size) over `state.world`;
    get(key) raises ValueError before init(), as Horovod's accessors do."""

    def get(key):
        w = state.world
        if w is None:
            raise ValueError("sparsync has not been initialized; use hvd.init().")
        return w[key]

    def rank():
        return get("rank")

    def size():
        return get("size")

    def local_rank():
        return get("local_rank")

    def local_size():
        return get("local_size")

    def cross_rank():
        return get("node_rank")

    def cross_size():
        return get("num_nodes")

    return get, rank, size, local_rank, local_size, cross_rank, cross_size
