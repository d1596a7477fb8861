"""Telemetry: real TensorBoard event files read back; RateMeter on a controlled clock."""

import threading

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from actorlearner import telemetry
from actorlearner.telemetry import RateMeter, Telemetry, format_progress, human


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def read_scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_scalars_are_written_and_read_back(tmp_path):
    with Telemetry(str(tmp_path)) as tel:
        assert tel.enabled
        tel.scalar(telemetry.EPISODIC_RETURN, 9.5, step=10)
        tel.scalar(telemetry.EPISODIC_RETURN, torch.tensor(20.0), step=20)
        tel.scalars({telemetry.TD_LOSS: 0.25, telemetry.REPLAY_SIZE: 1000,
                     telemetry.POLICY_VERSION: 3}, step=20)
    scalars = read_scalars(tmp_path)
    assert scalars == {
        "charts/episodic_return": [(10, 9.5), (20, 20.0)],
        "losses/td_loss": [(20, 0.25)],
        "replay/size": [(20, 1000.0)],
        "policy/version": [(20, 3.0)],
    }


def test_tags_are_namespaced_like_cleanrl():
    assert telemetry.EPISODIC_RETURN == "charts/episodic_return"
    assert telemetry.TD_LOSS == "losses/td_loss"
    assert telemetry.REPLAY_INSERT_RATE == "replay/insert_rate"
    assert telemetry.REPLAY_SAMPLE_RATE == "replay/sample_rate"
    assert telemetry.POLICY_LAG_MAX == "policy/lag_max"
    assert telemetry.EVAL_MEAN_RETURN == "eval/mean_return"


def test_concurrent_writers_lose_nothing(tmp_path):
    tel = Telemetry(str(tmp_path))

    def write(k: int) -> None:
        for step in range(50):
            tel.scalar(f"test/writer_{k}", step * k, step)

    threads = [threading.Thread(target=write, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tel.close()
    tel.close()  # Idempotent.
    scalars = read_scalars(tmp_path)
    assert all(len(scalars[f"test/writer_{k}"]) == 50 for k in range(4))


def test_without_logdir_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tel = Telemetry(None)
    assert not tel.enabled
    tel.scalar("charts/episodic_return", 1.0, 1)
    tel.scalars({"losses/td_loss": 1.0}, 1)
    tel.flush()
    tel.close()
    assert list(tmp_path.iterdir()) == []


def test_rate_before_and_after_the_window_fills():
    clock = FakeClock()
    meter = RateMeter(window=10.0, clock=clock)
    assert meter.rate() == 0.0
    clock.now += 2.0
    meter.add(100)
    assert meter.rate() == pytest.approx(50.0)  # 100 events in the 2 s since creation.
    clock.now += 8.0
    meter.add(300)
    assert meter.rate() == pytest.approx(40.0)  # 400 events in a full 10 s window.
    clock.now += 5.0
    assert meter.rate() == pytest.approx(30.0)  # The first 100 (at t=2) left the window.
    clock.now += 5.0
    assert meter.rate() == 0.0
    assert meter.total == 400


def test_rate_meter_is_thread_safe():
    meter = RateMeter(window=10.0, clock=FakeClock())

    def add() -> None:
        for _ in range(2000):
            meter.add()

    threads = [threading.Thread(target=add) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert meter.total == 8000
    assert len(meter._events) == 8000


def test_human_numbers():
    assert [human(x) for x in (0, 950, 12_345, 1_500_000, 2e9, 0.25)] == [
        "0", "950", "12.3k", "1.5M", "2G", "0.25"]
    assert human(float("nan")) == "-"


def test_format_progress_line():
    line = format_progress({
        "env_steps": 1_234_567, "sps": 4500.0, "return": 198.25, "version": 57, "lag_max": 3,
        "buffer_size": 450_000, "buffer_capacity": 1_000_000, "updates": 12_000,
        "actors": 4,
    })
    assert line == ("steps 1.23M | 4.5k sps | return 198.2 | v 57 (lag 3) | "
                    "buffer 450k/1M (45%) | updates 12k | actors 4")
    assert format_progress({"env_steps": 10, "return": float("nan"), "version": None}) == (
        "steps 10 | return -")
    assert "\n" not in line
