"""Queue order: largest first, with backfill of smaller trials into GPUs left over."""

from __future__ import annotations

from orchestrator.launcher.queue import QueuedTrial, pick_startable, queue_order


def _trials(gpus: list[int], est: list[float] | None = None) -> list[QueuedTrial]:
    return [QueuedTrial(i, g, f"t{i}", est[i] if est else None) for i, g in enumerate(gpus)]


def test_largest_first_then_backfill() -> None:
    queue = _trials([1, 2, 8, 4, 4, 1])
    assert [t.gpus for t in queue_order(queue)] == [8, 4, 4, 2, 1, 1]
    assert [t.index for t in pick_startable(queue, 8)] == [2]  # the 8-GPU trial alone
    assert [t.gpus for t in pick_startable(queue, 7)] == [4, 2, 1]  # 8 cannot start: backfill
    assert [t.gpus for t in pick_startable(queue, 3)] == [2, 1]
    assert pick_startable(queue, 0) == []


def test_estimates_put_the_longest_first() -> None:
    queue = _trials([1, 2, 4, 2], est=[100.0, 10.0, 10.0, 50.0])  # a long trial started late sets the end
    assert [t.index for t in queue_order(queue)] == [0, 3, 2, 1]  # equal estimates: wider first
    assert [t.index for t in pick_startable(queue, 5)] == [0, 3, 1]  # the 4-GPU one does not fit: backfill


def test_ties_keep_sweep_order() -> None:
    queue = _trials([2, 2, 2])
    assert [t.index for t in pick_startable(queue, 4)] == [0, 1]


def test_max_parallel_trials_replays_the_queue() -> None:
    from orchestrator.launcher.warmup import max_parallel_trials

    assert max_parallel_trials(_trials([8, 8, 8, 8]), 8) == 1  # the demo sweep: one at a time
    assert max_parallel_trials(_trials([8, 4, 4, 2, 2, 2, 2, 1, 1, 1, 1, 1]), 8) == 6
    assert max_parallel_trials(_trials([1, 2, 4]), 8) == 3


def test_plan_order_beats_longest_first_on_a_packing_case() -> None:
    from orchestrator.launcher.queue import list_schedule, plan_order

    # the scheduling benchmark's shape: widths 8,4,4,2x4,1x5, narrower trials run longer
    gpus = [8, 4, 4, 2, 2, 2, 2, 1, 1, 1, 1, 1]
    est = [3.3, 3.7, 3.7, 4.6, 4.6, 4.6, 4.6, 5.3, 5.3, 5.3, 5.3, 5.3]
    queue = _trials(gpus, est)
    lpt = [t.index for t in queue_order(queue)]
    plan_order(queue, 8)
    planned = [t.index for t in queue_order(queue)]
    assert sorted(planned) == list(range(12))
    assert list_schedule(planned, gpus, est, 8) < list_schedule(lpt, gpus, est, 8)
    # without estimates nothing is planned: widest first
    plain = _trials(gpus)
    plan_order(plain, 8)
    assert [t.gpus for t in queue_order(plain)][:3] == [8, 4, 4]


def test_on_a_cluster_each_trial_fits_one_node() -> None:
    from orchestrator.launcher.queue import list_schedule, place_startable
    from orchestrator.launcher.warmup import max_parallel_trials

    queue = _trials([6, 6, 4])
    # two nodes of 8: the two 6-GPU trials take a node each, and the 4-GPU one fits neither remainder,
    # though 4 GPUs are free in all
    assert [(t.gpus, node) for t, node in place_startable(queue, [8, 8])] == [(6, [0]), (6, [1])]
    assert [t.gpus for t in pick_startable(queue, 16)] == [6, 6, 4]  # one node of 16 holds all three
    assert max_parallel_trials(queue, [8, 8]) == 2 and max_parallel_trials(queue, 16) == 3
    assert list_schedule([0, 1, 2], [6, 6, 4], [1.0, 1.0, 1.0], [8, 8]) == 2.0
    assert list_schedule([0, 1, 2], [6, 6, 4], [1.0, 1.0, 1.0], 16) == 1.0
    assert list_schedule([0], [16], [1.0], [8, 8]) == float("inf")  # wider than every node
    # best fit: a narrow trial goes to the fullest node that takes it, keeping a whole node for a wide one
    assert place_startable(_trials([4]), [8, 4]) == [(_trials([4])[0], [1])]
    assert [(t.gpus, n) for t, n in place_startable(_trials([4, 8]), [8, 4])] == [(8, [0]), (4, [1])]


def test_a_trial_across_nodes_takes_whole_nodes_beside_smaller_ones() -> None:
    from orchestrator.launcher.queue import list_schedule, place_startable, plan_order
    from orchestrator.launcher.warmup import max_parallel_trials

    wide = QueuedTrial(0, 16, "tp8pp2", nodes=2)
    assert wide.gpus_per_node == 8
    # three nodes of 8, one of them half taken: the wide trial needs two whole ones, and gets them
    assert place_startable([wide], [8, 4, 8]) == [(wide, [0, 2])]
    assert place_startable([wide], [8, 4, 7]) == []  # only one whole node free: it waits
    # before a narrow trial that would break the second whole node, the wide one goes first (widest
    # first without estimates), and the narrow one backfills the third node
    narrow = QueuedTrial(1, 4, "tp4")
    assert [(t.label, n) for t, n in place_startable([narrow, wide], [8, 8, 8])] == [("tp8pp2", [0, 1]),
                                                                                    ("tp4", [2])]
    assert max_parallel_trials([wide, narrow, QueuedTrial(2, 4, "tp4b")], [8, 8, 8]) == 3
    # makespan: a 16-GPU trial of 2 s and two 8-GPU ones of 1 s on two nodes: 2 + 1, in either order
    gpus, durations, spans = [16, 8, 8], [2.0, 1.0, 1.0], [2, 1, 1]
    assert list_schedule([0, 1, 2], gpus, durations, [8, 8], spans) == 3.0
    assert list_schedule([1, 2, 0], gpus, durations, [8, 8], spans) == 3.0
    assert list_schedule([0], [16], [1.0], [8], [2]) == float("inf")  # more nodes than the cluster has
    # on three nodes the planned order runs the two narrow ones beside the wide one
    trials = [QueuedTrial(0, 16, "w", 2.0, nodes=2), QueuedTrial(1, 8, "a", 1.0), QueuedTrial(2, 8, "b", 1.0)]
    plan_order(trials, [8, 8, 8])
    order = sorted(range(3), key=lambda i: trials[i].priority or 0)
    assert list_schedule(order, gpus, durations, [8, 8, 8], spans) == 2.0
