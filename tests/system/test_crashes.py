"""Crashes and partitions with real processes, signals and sockets: what survives, what is lost, what stays bounded."""

import logging
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from actorlearner.actor.actor import Actor
from actorlearner.actor.link import LearnerLink
from actorlearner.checkpoint.parts import CheckpointError, read_part
from actorlearner.checkpoint.store import CheckpointStore
from actorlearner.config import ActorConfig, LearnerConfig
from actorlearner.learner.learner import Learner
from actorlearner.learner.server import serve
from procs import (FAST_LEARNER, NOT_TRAINING, PACED, free_port, rss_kib, start_actor, start_learner, status,
                   stop, wait_until)
from raw_actor import RawActor, tagged_rows
from streams import hello
from tcp_proxy import UP, TcpProxy

RAW_ACTOR = str(Path(__file__).parents[1] / "support" / "raw_actor.py")
TAG = 4242.0  # obs[:, 2] of a raw actor's transitions; CartPole never gets there
ROWS = 16  # transitions per raw-actor batch
BIG_LEARNER = [*FAST_LEARNER, "--replay-capacity", "300000"]  # never wraps within a test: tagged rows stay
# BIG_LEARNER that stores every batch and never trains, for tests about streams rather than training: its
# trainer does not take a core while the test waits.
STORING_LEARNER = [*FAST_LEARNER, *NOT_TRAINING, "--replay-capacity", "300000"]
# Paced actors' batches (procs.PACED) come often with small ones.
SMALL_BATCHES = ["--actor-batch-size", "32"]
ACTOR_BATCH = LearnerConfig().actor_batch_size  # transitions per batch an actor streams
# Where a test is not about backoff, actors retry at least every RECONNECT_MAX * 1.5 s (jitter);
# RECONNECTED is that plus a busy machine's slack.
RECONNECT_MAX = 1.0
QUICK_RECONNECT = ["--reconnect-max", str(RECONNECT_MAX)]
RECONNECTED = 1.5 * RECONNECT_MAX + 30


def connected(port: int) -> set[str]:
    return {a.actor_id for a in status(port).actors if a.connected}


def final_checkpoint(directory: Path) -> dict:
    """Parts of the newest checkpoint of a learner that has exited."""
    return CheckpointStore(directory).load_latest()[1]


def saved_seq(directory: Path, actor_id: str) -> int:
    """``actor_id``'s entry in the newest readable checkpoint of a live learner (-1 if none)."""
    for path in sorted(directory.glob("ckpt-*"), reverse=True):
        try:
            return read_part(path / "learner.part")[0]["seq_table"].get(actor_id, -1)
        except (OSError, CheckpointError):  # pruned or replaced while we read it
            continue
    return -1


def test_actor_killed_with_a_batch_half_sent_leaves_nothing_of_it(tmp_path):
    """gRPC hands over whole messages: a batch cut off by SIGKILL halfway through the wire is not inserted."""
    ckpt = tmp_path / "ckpt"
    learner, port = start_learner(*STORING_LEARNER, *SMALL_BATCHES, "--checkpoint-dir", str(ckpt))
    survivor = start_actor(port, "survivor", *PACED)
    proxy = TcpProxy(port)
    victim = subprocess.Popen([sys.executable, RAW_ACTOR, f"127.0.0.1:{proxy.port}", "victim", str(TAG)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in victim.stdout], daemon=True).start()

    seen: list[str] = []

    def victim_says(prefix: str) -> list[str]:
        """The victim's next line starting with ``prefix``; what it said before, and where its bytes
        went, if none comes within a minute (or its stream ends)."""
        while True:
            try:
                line = lines.get(timeout=60)
            except queue.Empty:
                raise AssertionError(f"no {prefix!r} line from the victim in 60 s; it said {seen}; proxy "
                                     f"forwarded {proxy.forwarded}, live {proxy.live()}") from None
            seen.append(line.strip())
            if line.startswith(prefix):
                return line.split()
            assert not line.startswith("ended"), f"the victim's stream ended: it said {seen}"

    try:
        assert victim_says("welcome")
        victim.stdin.write("".join(f"send {seq} {ROWS}\n" for seq in range(1, 6)))
        victim.stdin.flush()
        assert sorted(victim_says("ack")[1:] for _ in range(5)) == [[str(seq), "1"] for seq in range(1, 6)]
        wait_until(lambda: "survivor" in connected(port) and status(port).inserted > 10, 60, "the survivor streaming")

        # Let 2 MB of the next batch through, then hold the rest, as a slow link would.
        sent_before = proxy.forwarded[UP]
        proxy.stall(up_after=2_000_000, down_after=None)
        victim.stdin.write("send 6 120000\n")
        victim.stdin.flush()
        size = int(victim_says("sending")[2])
        wait_until(lambda: proxy.forwarded[UP] - sent_before >= 2_000_000, 60, "2 MB of the batch to pass")
        partial = proxy.forwarded[UP] - sent_before  # the stall holds the rest
        assert partial < size, f"{partial} of {size} bytes of the batch reached the learner"
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        proxy.cut()  # the dead process's connection closes; the rest of the batch never comes

        wait_until(lambda: "victim" not in connected(port), 30, "the learner to drop the dead actor")
        before = status(port).inserted
        wait_until(lambda: status(port).inserted > before + 5, 30, "the survivor's batches to keep arriving")
        assert learner.poll() is None and survivor.poll() is None and "survivor" in connected(port)
    finally:
        victim.kill()
        proxy.close()
        codes = stop(survivor, learner)
    assert codes == [0, 0]
    parts = final_checkpoint(ckpt)  # written on SIGTERM: everything the learner holds
    assert parts["learner"]["seq_table"]["victim"] == 5
    assert tagged_rows(parts["replay"]["field.obs"].numpy(), TAG) == {seq: list(range(ROWS)) for seq in range(1, 6)}


def test_killed_learner_resumes_from_its_checkpoint_and_actors_come_back(tmp_path):
    ckpt, port = tmp_path / "ckpt", free_port()
    args = [*BIG_LEARNER, *SMALL_BATCHES, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1"]
    learner, _ = start_learner(*args, port=port)
    actors = [start_actor(port, "a0", *QUICK_RECONNECT, *PACED),
              start_actor(port, "a1", "--seed", "1", *QUICK_RECONNECT, *PACED)]
    restarted = None
    try:
        wait_until(lambda: connected(port) == {"a0", "a1"} and status(port).updates > 20, 60, "training")
        probe = RawActor(f"127.0.0.1:{port}", "probe", TAG)
        assert probe.exchange(range(1, 6), ROWS) == [(seq, True, "") for seq in range(1, 6)]
        probe.close()
        wait_until(lambda: saved_seq(ckpt, "probe") == 5, 60, "a checkpoint holding the probe's batches")
        first_id = status(port).learner_id
        learner.send_signal(signal.SIGKILL)
        learner.wait(10)

        step, saved = CheckpointStore(ckpt).load_latest()  # what the restarted learner will find
        saved_version, saved_updates = saved["learner"]["version"], saved["learner"]["updates"]
        saved_size = len(saved["replay"]["keys"])
        assert saved["learner"]["seq_table"]["probe"] == 5 and saved_updates == step > 0

        restarted, _ = start_learner(*args, port=port)
        resumed = status(port)
        assert resumed.learner_id != first_id
        assert resumed.policy_version >= saved_version > 0 and resumed.updates >= saved_updates
        assert resumed.buffer_size >= saved_size
        # The actors, never restarted, find the new learner on their own.
        wait_until(lambda: connected(port) == {"a0", "a1"}, RECONNECTED, "both actors to reconnect")
        assert all(a.poll() is None for a in actors)
        # Acked before the checkpoint: resent, acked again as duplicates and not stored twice.
        probe = RawActor(f"127.0.0.1:{port}", "probe", TAG)
        assert probe.exchange(range(1, 6), ROWS) == [(seq, True, "duplicate") for seq in range(1, 6)]
        assert probe.exchange([6], ROWS) == [(6, True, "")]
        probe.close()
        wait_until(lambda: (s := status(port)).updates > resumed.updates + 20 and s.policy_version > saved_version
                   and s.inserted > 10, 30, "training and streaming to go on")
    finally:
        codes = stop(*actors, *([restarted] if restarted else []))
        learner.kill()
    assert codes == [0, 0, 0]
    final = final_checkpoint(ckpt)
    assert tagged_rows(final["replay"]["field.obs"].numpy(), TAG) == {seq: list(range(ROWS)) for seq in range(1, 7)}
    assert final["learner"]["version"] > saved_version


def test_partitioned_actor_holds_a_bounded_window_backs_off_and_loses_nothing():
    window = 4
    learner, port = start_learner(*STORING_LEARNER, "--max-unacked", str(window))
    proxy = TcpProxy(port)
    # sync: the envs step in this process (the default, ahead, starts a process for them); not paced: an
    # open window must show as many batches passing while the link stalls
    config = ActorConfig(learner=f"127.0.0.1:{proxy.port}", actor_id="partitioned", num_envs=2, vector_mode="sync")
    actor = Actor(config)
    runner = threading.Thread(target=actor.run, daemon=True)
    runner.start()
    try:
        wait_until(lambda: status(port).inserted > 20, 60, "batches flowing")
        link = actor.link

        # A stalled link: nothing moves, nothing closes. The window fills and the env loop waits on it.
        proxy.stall()
        wait_until(lambda: link.unacked == window, 30, "the window to fill")
        sent, steps = actor.batches_sent, actor.env_steps
        time.sleep(2)  # an open window would pass many batches meanwhile; a busy machine only fewer
        # Acks already past the proxy when it stalled free at most a window's worth of batches (and the
        # count may lag the window by the one batch being added); their env steps, a batch each.
        extra = actor.batches_sent - sent
        assert link.unacked == window and extra <= window + 1, (link.unacked, extra)
        assert actor.env_steps - steps <= (extra + 2) * ACTOR_BATCH, (actor.env_steps - steps, extra)
        inserted = status(port).inserted
        proxy.resume()
        wait_until(lambda: status(port).inserted > inserted + window, 60, "the actor to resume")

        # The learner unreachable: the stream breaks and every reconnect is refused; the actor keeps
        # trying, and before its k-th retry waits at least reconnect_initial * 2**k (doubling, capped at
        # reconnect_max) times the jitter's least factor, 0.5. The proxy notes each attempt before it
        # closes it, so a gap between attempts holds the whole wait.
        first, reconnects = len(proxy.accept_times), link.reconnects
        proxy.refuse()
        proxy.cut()
        waits = [min(config.reconnect_initial * 2**k, config.reconnect_max) for k in range(5)]
        wait_until(lambda: len(proxy.accept_times) >= first + len(waits), 1.5 * sum(waits) + 30,
                   f"{len(waits)} refused connection attempts")
        gaps = np.diff(proxy.accept_times[first:first + len(waits)])
        assert all(gap >= 0.5 * wait for gap, wait in zip(gaps, waits[1:])), f"gaps {gaps} for waits {waits}"
        assert link.unacked <= window and link.reconnects > reconnects
        inserted = status(port).inserted
        proxy.resume()
        wait_until(lambda: status(port).inserted > inserted + window, 1.5 * config.reconnect_max + 30,
                   "the actor to reconnect and stream again")
    finally:
        actor.stop()
        runner.join(30)
        proxy.close()
        final = status(port)
        codes = stop(learner)
    assert not runner.is_alive() and codes == [0]
    assert link.unacked == 0 and link.peak_unacked == window
    # Every batch the actor made was acked and stored exactly once.
    assert final.inserted == actor.batches_sent and final.buffer_size == ACTOR_BATCH * actor.batches_sent


def test_slow_learner_keeps_memory_bounded_on_both_sides(tmp_path):
    """Inserts wait on the rate limiter, the stream stalls, the actors' windows fill and their env loops wait."""
    spi, error_buffer, min_size, batch = 64, 4096, 256, 64
    learner, port = start_learner(*FAST_LEARNER, "--samples-per-insert", str(spi), "--rate-error-buffer",
                                  str(error_buffer), "--max-unacked", "4")
    logs = [tmp_path / f"a{i}.log" for i in range(2)]
    actors = [start_actor(port, f"a{i}", "--seed", str(i), stderr=log.open("w")) for i, log in enumerate(logs)]
    try:
        wait_until(lambda: connected(port) == {"a0", "a1"} and status(port).updates > 50, 60, "training")

        def limited():  # the limiter holds inserts back: the streams stall and the actors' windows fill
            s = status(port)
            return s.buffer_size >= min_size + (error_buffer + s.updates * batch) / spi - 2 * ACTOR_BATCH

        wait_until(limited, 60, "inserts to wait on the rate limiter")
        procs = [learner, *actors]
        rss = [[rss_kib(p.pid)] for p in procs]
        for _ in range(20):
            time.sleep(0.5)
            for samples, proc in zip(rss, procs):
                samples.append(rss_kib(proc.pid))
        s = status(port)
    finally:
        codes = stop(*actors, learner)
    assert codes == [0, 0, 0]
    for name, samples in zip(("learner", "a0", "a1"), rss):
        assert max(samples) < 1.2 * samples[0], f"{name} RSS grew from {samples[0]} to {max(samples)} KiB: {samples}"
    # The limiter held inserts to what training allows (one overshooting batch per stream at most).
    allowed = min_size + (error_buffer + s.updates * batch) / spi
    assert s.buffer_size <= allowed + 2 * ACTOR_BATCH + ACTOR_BATCH, (s.buffer_size, allowed)
    for log in logs:
        peak, window = map(int, re.search(r"unacked window peak (\d+) of (\d+)", log.read_text()).groups())
        assert peak == window == 4, log.read_text()[-2000:]


@pytest.fixture
def netns():
    """A network namespace joined to this one by a veth pair: (namespace, host-side link, host-side address)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 for a network namespace")
    name, net = f"al{os.getpid()}", f"10.231.{os.getpid() % 250}"
    host_if, ns_if = f"{name}h", f"{name}n"
    setup = [["netns", "add", name], ["link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", name],
             ["addr", "add", f"{net}.1/30", "dev", host_if], ["link", "set", host_if, "up"],
             ["-n", name, "addr", "add", f"{net}.2/30", "dev", ns_if], ["-n", name, "link", "set", ns_if, "up"],
             ["-n", name, "link", "set", "lo", "up"]]
    try:
        for args in setup:
            done = subprocess.run(["ip", *args], capture_output=True, text=True)
            if done.returncode:
                pytest.skip(f"cannot build a network namespace: ip {' '.join(args)}: {done.stderr.strip()}")
        yield name, host_if, f"{net}.1"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)  # takes the veth pair with it
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)


def test_actor_in_a_network_namespace_survives_its_link_going_down(netns, tmp_path):
    """A kernel-level partition: the veth link goes down under a live stream and comes back."""
    name, host_if, host = netns
    learner, port = start_learner(*STORING_LEARNER, "--host", host, "--max-unacked", "4")
    log = tmp_path / "actor.log"
    # sync: one actor process (ahead would start a second); not paced: a live link must carry many batches
    actor = subprocess.Popen(["ip", "netns", "exec", name, sys.executable, "-m", "actorlearner", "actor", "--learner",
                              f"{host}:{port}", "--actor-id", "netns", "--num-envs", "2", "--vector-mode", "sync",
                              *QUICK_RECONNECT], stderr=log.open("w"))
    try:
        wait_until(lambda: status(port, host).inserted > 10, 60, "batches flowing over the veth link")
        subprocess.run(["ip", "link", "set", host_if, "down"], check=True)
        inserted = status(port, host).inserted
        time.sleep(3)  # a live link would carry many batches meanwhile
        # Only what had crossed before the link went down (at most the window) can still be inserted.
        assert status(port, host).inserted <= inserted + 4 and actor.poll() is None
        subprocess.run(["ip", "link", "set", host_if, "up"], check=True)
        # TCP retransmits with a growing backoff; or the actor reconnects.
        wait_until(lambda: status(port, host).inserted > inserted + 4, 60, "the stream to resume over the link")
    finally:
        actor_code, = stop(actor)
        final = status(port, host)
        learner_code, = stop(learner)
    assert (actor_code, learner_code) == (0, 0)
    text = log.read_text()
    peak, window = map(int, re.search(r"unacked window peak (\d+) of (\d+)", text).groups())
    batches = int(re.search(r"stopped after \d+ env steps, (\d+) batches", text).group(1))
    assert peak == window == 4  # the window filled while the link was down, and went no further
    assert final.inserted == batches and final.buffer_size == ACTOR_BATCH * batches  # nothing acked lost, nothing twice


def test_backoff_starts_afresh_after_a_stream_that_worked_breaks(caplog):
    """A long-lived actor whose healthy stream is cut must come back at once, not after ever longer waits."""
    learner = Learner(LearnerConfig(env="CartPole-v1", eval_every=0))
    with serve(learner, "127.0.0.1", 0) as port, caplog.at_level(logging.INFO, logger="actorlearner.actor.link"):
        proxy = TcpProxy(port)
        link = LearnerLink(f"127.0.0.1:{proxy.port}", hello("cut-often").hello, 16 << 20,
                           reconnect_initial=0.1, reconnect_max=5.0).start()
        try:
            for cut in range(1, 5):
                wait_until(lambda: link.connected and link.welcomes == cut, 60, f"stream {cut} welcomed")
                proxy.cut()
                wait_until(lambda: link.reconnects == cut, 60, f"reconnect {cut}")
        finally:
            link.close()
            proxy.close()
    delays = re.findall(r"reconnecting in (\d+\.\d+)s", caplog.text)
    assert delays == ["0.10"] * 4, delays  # not 0.10, 0.20, 0.40, 0.80
    learner.stop()
