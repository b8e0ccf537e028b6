"""Worker: Horovod's process sets in sparsync.torch, for 4 ranks (test_process_sets.py).

Sets: trio [0, 1, 3] (init, a ProcessSet), pair [0, 1] (init, a rank list), even [0, 2] and odd
[1, 3] (add_process_set). Every rank computes what each result must be from the inputs of all
ranks (deterministic in the rank and the case) and asserts it; a failure exits non-zero with the
check's name. Prints "PROCESS SETS OK".
"""

import os
import sys
import time

import torch

import sparsync.torch as hvd

torch.set_num_threads(1)
SLEEP_S = float(os.environ.get("PS_SLEEP_S", "4"))


def check(name, ok, detail=""):
    if not ok:
        print("FAILED %s %s" % (name, detail), flush=True)
        sys.exit(1)


def raises(name, exc, call, *words):
    """`call()` raises `exc` whose message holds every one of `words`."""
    try:
        call()
    except exc as e:
        for w in words:
            check(name + " message", w in str(e), "%r not in %r" % (w, str(e)))
        return
    except Exception as e:  # noqa: B902 -- any other exception is the failure
        check(name, False, "raised %r instead of %s" % (e, exc.__name__))
    check(name, False, "did not raise %s" % exc.__name__)


def value(case, k, shape, dtype=torch.float32, integral=False):
    """Rank k's input for `case` (every rank can compute every rank's)."""
    g = torch.Generator().manual_seed(sum(map(ord, case)) * 101 + k)
    x = torch.rand(shape, generator=g, dtype=torch.float64) * 8 - 4
    return (x.round() if integral else x).to(dtype)


trio_init = hvd.ProcessSet([3, 1, 0])
check("ranks sorted", trio_init.ranks == [0, 1, 3])
check("not added: size None", trio_init.size() is None and trio_init.process_set_id is None)
raises("duplicate at init", ValueError,
       lambda: hvd.init(process_sets=[[0, 1], hvd.ProcessSet([1, 0])]), "entry number 1")
check("left uninitialized", not hvd.is_initialized())
hvd.init(process_sets=[trio_init, [0, 1]])
r, n = hvd.rank(), hvd.size()
check("four ranks", n == 4, str(n))
trio = trio_init
pair = hvd.ProcessSet([1, 0])  # made after init: collectives take it for the added [0, 1]
even = hvd.add_process_set([0, 2])
odd = hvd.add_process_set(hvd.ProcessSet([1, 3]))

# --- the sets themselves ------------------------------------------------------------------------
check("ids in order", (trio.process_set_id, even.process_set_id, odd.process_set_id) == (1, 3, 4))
gs = hvd.global_process_set
check("global set", gs.process_set_id == 0 and gs.ranks == list(range(n)) and gs.size() == n
      and gs.rank() == r and gs.included() is True)
check("sizes", (trio.size(), even.size(), odd.size()) == (3, 2, 2))
for ps in (trio, even, odd):
    check("included %s" % ps, ps.included() == (r in ps.ranks))
    if r in ps.ranks:
        check("set rank %s" % ps, ps.rank() == ps.ranks.index(r))
    else:
        raises("set rank of a non-member %s" % ps, ValueError, ps.rank, "not part")

# --- duplicates and bad sets (no daemon involved: every rank alike) ------------------------------
raises("duplicate ranks", ValueError, lambda: hvd.add_process_set([2, 0]), "duplicate")
raises("duplicate object", ValueError, lambda: hvd.add_process_set(odd), "duplicate")
raises("duplicate of init's", ValueError, lambda: hvd.add_process_set([0, 1]), "duplicate")
raises("global ranks", ValueError, lambda: hvd.add_process_set(range(n)), "duplicate")
raises("out of range", ValueError, lambda: hvd.add_process_set([0, n]), "not ranks")
raises("repeated rank", ValueError, lambda: hvd.ProcessSet([1, 1]), "distinct")
raises("not ranks", ValueError, lambda: hvd.ProcessSet("01"))
check("remove global", hvd.remove_process_set(gs) is False)


# --- every collective within each set this rank is a member of ----------------------------------
def battery(ps):
    # `pair` is not the added object (its size() is None): its ranks give the same answers.
    R = ps.ranks
    m, me = len(R), R.index(r)
    tag = "[set %s] " % R

    def same_on_members(name, t):
        rows = hvd.allgather(t.reshape(1, -1), process_set=ps)
        check(tag + name + " identical", all(torch.equal(rows[0], rows[i]) for i in range(m)))

    x = value("sum", r, (3, 5), integral=True)
    got = hvd.allreduce(x, op=hvd.Sum, name="sum", process_set=ps)
    check(tag + "allreduce sum exact",
          torch.equal(got, sum(value("sum", k, (3, 5), integral=True) for k in R)))
    x = value("avg", r, (7,))
    got = hvd.allreduce(x, process_set=ps)
    want = torch.stack([value("avg", k, (7,), torch.float64) for k in R]).mean(0)
    check(tag + "allreduce average", torch.allclose(got.double(), want, rtol=1e-6, atol=1e-6),
          "%s vs %s" % (got, want))
    same_on_members("allreduce average", got)
    got = hvd.allreduce(value("f64", r, (4,), torch.float64), name="f64", process_set=ps)
    want = torch.stack([value("f64", k, (4,), torch.float64) for k in R]).mean(0)
    check(tag + "allreduce float64", torch.allclose(got, want, rtol=1e-12, atol=1e-12))
    got = hvd.allreduce(value("f64", r, (4,), torch.float64) * 2, name="f64", process_set=ps)
    check(tag + "allreduce again (kept registration)",
          torch.allclose(got, 2 * want, rtol=1e-12, atol=1e-12))
    got = hvd.allreduce(torch.tensor([10 * r + 1, r]), process_set=ps)  # int64 average: floor
    check(tag + "allreduce int average",
          got.tolist() == [sum(10 * k + 1 for k in R) // m, sum(R) // m], str(got))
    t = torch.full((2,), float(r))
    check(tag + "allreduce_", hvd.allreduce_(t, op=hvd.Sum, process_set=ps) is t and
          torch.equal(t, torch.full((2,), float(sum(R)))))
    h = hvd.allreduce_async(torch.ones(3), op=hvd.Sum, prescale_factor=2.0,
                            postscale_factor=0.5, process_set=ps)
    check(tag + "allreduce async scaled", torch.equal(hvd.synchronize(h),
                                                      torch.full((3,), float(m))))

    got = hvd.allgather(torch.full((r + 1, 2), float(r)), name="ag", process_set=ps)
    want = torch.cat([torch.full((k + 1, 2), float(k)) for k in R])
    check(tag + "allgather, first dimensions differ", torch.equal(got, want), str(got))
    check(tag + "allgather scalar", torch.equal(hvd.allgather(torch.tensor(r), process_set=ps),
                                                torch.tensor(R)))
    for root in R:
        got = hvd.broadcast(value("bc", r, (2, 3)), root, name="bc.%d" % root, process_set=ps)
        check(tag + "broadcast from %d" % root, torch.equal(got, value("bc", root, (2, 3))))
    t = torch.full((4,), float(r))
    hvd.broadcast_(t, R[-1], process_set=ps)
    check(tag + "broadcast_", torch.equal(t, torch.full((4,), float(R[-1]))))
    outside = [k for k in range(n) if k not in R][0]
    raises(tag + "broadcast from a non-member", ValueError,
           lambda: hvd.broadcast(torch.ones(1), outside, process_set=ps), "root_rank %d" % outside)
    check(tag + "broadcast_object",
          hvd.broadcast_object({"from": r}, R[-1], process_set=ps) == {"from": R[-1]})
    check(tag + "allgather_object", hvd.allgather_object((r, "x"), process_set=ps) ==
          [(k, "x") for k in R])

    outs = hvd.grouped_allreduce([value("g1", r, (5,), integral=True), torch.arange(3) * r],
                                 op=hvd.Sum, name="grouped", process_set=ps)
    check(tag + "grouped_allreduce",
          torch.equal(outs[0], sum(value("g1", k, (5,), integral=True) for k in R)) and
          torch.equal(outs[1], torch.arange(3) * sum(R)))
    outs = hvd.grouped_allgather([torch.full((r + 1,), r), torch.tensor([[r, r]])],
                                 process_set=ps)
    check(tag + "grouped_allgather",
          torch.equal(outs[0], torch.cat([torch.full((k + 1,), k) for k in R])) and
          torch.equal(outs[1], torch.tensor([[k, k] for k in R])))
    outs = hvd.grouped_reducescatter([torch.ones(m, 2) * r, torch.ones(2 * m) * (r + 1)],
                                     op=hvd.Sum, process_set=ps)
    check(tag + "grouped_reducescatter",
          torch.equal(outs[0], torch.full((1, 2), float(sum(R)))) and
          torch.equal(outs[1], torch.full((2,), float(sum(k + 1 for k in R)))))

    # alltoall: set rank i sends j + 1 rows [r, j, row] to set rank j.
    rows = torch.cat([torch.tensor([[r, j, i] for i in range(j + 1)]) for j in range(m)])
    out, received = hvd.alltoall(rows, splits=[j + 1 for j in range(m)], process_set=ps)
    want = torch.cat([torch.tensor([[k, me, i] for i in range(me + 1)]) for k in R])
    check(tag + "alltoall with splits", torch.equal(out, want), str(out))
    check(tag + "alltoall received splits", received.tolist() == [me + 1] * m)
    out = hvd.alltoall(torch.arange(2 * m) + 100 * r, process_set=ps)
    check(tag + "alltoall even",
          out.tolist() == [100 * k + 2 * me + j for k in R for j in (0, 1)], str(out))
    raises(tag + "alltoall splits per set rank", ValueError,
           lambda: hvd.alltoall(torch.arange(n), splits=[1] * n, process_set=ps), "%d" % m)

    full = torch.arange(2 * m + 1, dtype=torch.float32).reshape(-1, 1) * (r + 1)
    mine = hvd.reducescatter(full, op=hvd.Sum, process_set=ps)
    counts = [2 + (1 if i < 1 else 0) for i in range(m)]
    total = torch.arange(2 * m + 1, dtype=torch.float32).reshape(-1, 1) * sum(k + 1 for k in R)
    start = sum(counts[:me])
    check(tag + "reducescatter sum", torch.equal(mine, total[start:start + counts[me]]), str(mine))
    avg = hvd.reducescatter(torch.ones(m, 3) * r, process_set=ps)
    check(tag + "reducescatter average", torch.allclose(avg, torch.full((1, 3), sum(R) / m)))

    check(tag + "barrier", hvd.barrier(process_set=ps) is None)

    xs = {k: value("minmax", k, (3, 4), torch.float64) for k in R}
    stacked = torch.stack([xs[k] for k in R])
    check(tag + "min", torch.equal(hvd.allreduce(xs[r], op=hvd.Min, process_set=ps),
                                   stacked.amin(0)))
    check(tag + "max", torch.equal(hvd.allreduce(xs[r], op=hvd.Max, name="mx", process_set=ps),
                                   stacked.amax(0)))
    ints = torch.tensor([r + 1, -r, 2])
    check(tag + "product int", torch.equal(hvd.allreduce(ints, op=hvd.Product, process_set=ps),
                                           torch.stack([torch.tensor([k + 1, -k, 2])
                                                        for k in R]).prod(0)))
    if m & (m - 1) == 0:
        e = torch.zeros(m)
        e[me] = 1.0
        check(tag + "adasum of orthogonal vectors",
              torch.equal(hvd.allreduce(e, op=hvd.Adasum, process_set=ps), torch.ones(m)))
    else:
        raises(tag + "adasum needs a power of two", ValueError,
               lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum, process_set=ps), "%d" % m)
    sp = torch.sparse_coo_tensor(torch.tensor([[me, 0]]), torch.tensor([[1.0], [2.0]]), (m, 1))
    dense = hvd.synchronize(hvd.sparse_allreduce_async(sp, op=hvd.Sum, process_set=ps))
    want = torch.ones(m, 1)
    want[0] += 2.0 * m
    check(tag + "sparse_allreduce", torch.equal(dense.to_dense(), want), str(dense))


for ps in (trio, pair, even, odd):
    if r in ps.ranks:
        battery(ps)
hvd.barrier()

# --- a rank outside a set is refused before anything reaches the daemon -------------------------
other = odd if r in even.ranks else even
label = "rank %d is not a member" % r
for what, call in [
        ("allreduce", lambda: hvd.allreduce(torch.ones(1), process_set=other)),
        ("allreduce_async_", lambda: hvd.allreduce_async_(torch.ones(1), process_set=other)),
        ("allgather", lambda: hvd.allgather(torch.ones(1), process_set=other)),
        ("broadcast", lambda: hvd.broadcast(torch.ones(1), other.ranks[0], process_set=other)),
        ("broadcast_object", lambda: hvd.broadcast_object(1, other.ranks[0], process_set=other)),
        ("allgather_object", lambda: hvd.allgather_object(1, process_set=other)),
        ("grouped_allreduce", lambda: hvd.grouped_allreduce([torch.ones(1)] * 2,
                                                            process_set=other)),
        ("alltoall", lambda: hvd.alltoall(torch.ones(2), process_set=other)),
        ("reducescatter", lambda: hvd.reducescatter(torch.ones(2), process_set=other)),
        ("barrier", lambda: hvd.barrier(process_set=other)),
        ("min", lambda: hvd.allreduce(torch.ones(1), op=hvd.Min, process_set=other)),
        ("DistributedOptimizer", lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1), process_set=other))]:
    raises("non-member " + what, ValueError, call, label, str(other.ranks))
raises("a set never added", ValueError,
       lambda: hvd.allreduce(torch.ones(1), process_set=hvd.ProcessSet([0, 2, 3])),
       "not been added")
raises("not a ProcessSet", TypeError, lambda: hvd.allreduce(torch.ones(1), process_set=[0, 1]))

# --- one name in several sets and in the global set at once: no collision ------------------------
mine = even if r in even.ranks else odd
h_set = hvd.allreduce_async(torch.full((3 + mine.process_set_id,), float(r)), name="same.name",
                            op=hvd.Sum, process_set=mine)
h_glob = hvd.allreduce_async(torch.ones(7), name="same.name", op=hvd.Sum)
check("same name in a set", torch.equal(hvd.synchronize(h_set),
                                        torch.full((3 + mine.process_set_id,),
                                                   float(sum(mine.ranks)))))
check("same name in the global set", torch.equal(hvd.synchronize(h_glob),
                                                 torch.full((7,), float(n))))
# Unnamed ops count per set: the odd set's run of unnamed ops leaves the global numbering alone.
if r in odd.ranks:
    for _ in range(3):
        hvd.allreduce(torch.ones(1), process_set=odd)
check("unnamed global after a set's unnamed ops",
      torch.equal(hvd.allreduce(torch.ones(2) * r, op=hvd.Sum), torch.full((2,), 6.0)))

# --- the odd set's collectives do not wait for the even ranks, which call nothing meanwhile -------
hvd.barrier()
done = wake = 0.0
if r in odd.ranks:
    for i in range(50):
        got = hvd.allreduce(torch.full((4,), float(r + i)), name="isolated", op=hvd.Sum,
                            process_set=odd)
        check("isolated allreduce %d" % i, torch.equal(got, torch.full((4,), float(4 + 2 * i))))
    done = time.time()
else:
    time.sleep(SLEEP_S)
    wake = time.time()
    # Now the even set, whose ranks were away.
    check("even set after its sleep", torch.equal(
        hvd.allreduce(torch.ones(2), op=hvd.Sum, process_set=even), torch.full((2,), 2.0)))
stamps = hvd.allgather(torch.tensor([[done, wake]], dtype=torch.float64))
odd_done = max(float(stamps[k, 0]) for k in odd.ranks)
even_wake = min(float(stamps[k, 1]) for k in even.ranks)
check("odd set finished before the even ranks woke", odd_done < even_wake,
      "odd done at %.3f, even woke at %.3f" % (odd_done, even_wake))
print("isolation: the odd set's 50 allreduces ended %.2f s before the even ranks woke"
      % (even_wake - odd_done), flush=True)

# --- DistributedOptimizer within a set (trio: the average divides by 3) --------------------------
if r in trio.ranks:
    raises("sparsify within a set", NotImplementedError, lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1), process_set=trio,
        sparsify=hvd.TopK(density=0.5)), "dense")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    ref = torch.nn.Linear(4, 3)
    ref.load_state_dict(model.state_dict())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), process_set=trio)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)

    def batch(step, k):
        return value("x%d" % step, k, (8, 4)), value("y%d" % step, k, (8, 3))

    for step in range(3):
        opt.zero_grad()
        xb, yb = batch(step, r)
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
        ref_opt.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(ref(batch(step, k)[0]), batch(step, k)[1])
                   for k in trio.ranks) / trio.size()
        loss.backward()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        check("optimizer in a set: %s" % name, torch.allclose(p, q, rtol=1e-5, atol=1e-6),
              "%s vs %s" % (p, q))
        same = hvd.allgather(p.detach().reshape(1, -1), process_set=trio)
        check("optimizer in a set: %s identical" % name,
              all(torch.equal(same[0], same[i]) for i in range(trio.size())))
    opt.unregister()
hvd.barrier()

# --- remove, and add again ------------------------------------------------------------------------
check("remove", hvd.remove_process_set(even) is True and even.process_set_id is None)
check("remove again", hvd.remove_process_set(even) is False)
if r in (0, 2):
    raises("a removed set", ValueError,
           lambda: hvd.allreduce(torch.ones(1), process_set=even), "not been added")
again = hvd.add_process_set([0, 2])
check("added again: a new id", again.process_set_id not in (None, 1, 2, 3, 4),
      str(again.process_set_id))
if r in again.ranks:
    check("the set added again", torch.equal(
        hvd.allreduce(torch.full((3,), float(r)), name="sum", op=hvd.Sum, process_set=again),
        torch.full((3,), 2.0)))
check("global after all", torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum),
                                      torch.full((1,), float(n))))
print("PROCESS SETS OK", flush=True)
hvd.shutdown()
