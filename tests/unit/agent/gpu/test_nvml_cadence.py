"""Per-link NVLink counters are read every nvlink_interval_s, and rates use the links' own time."""

from __future__ import annotations

from rasd.agent.core import health, model

S = 1_000_000_000


def _link_reads(fake) -> int:
    """nvmlDeviceGetFieldValues calls that asked for per-link NVLink errors (field 161-163, scope = link)."""
    return sum(
        1
        for name, args in fake.calls
        if name == "nvmlDeviceGetFieldValues"
        and any(args[2]._obj[i].fieldId in (161, 162, 163) for i in range(args[1].value))
    )


def test_links_are_read_once_per_interval(fake, open_backend):
    backend = open_backend(nvlink_interval_s=10.0)
    before = _link_reads(fake)
    first = backend.read_counters(0)
    after_first = _link_reads(fake)
    assert after_first > before
    second = backend.read_counters(5 * S)
    assert _link_reads(fake) == after_first  # cached
    assert second[0].nvlinks == first[0].nvlinks and second[0].nvlink_sample_unix_ns == 0
    third = backend.read_counters(10 * S)
    assert _link_reads(fake) > after_first
    assert third[0].nvlink_sample_unix_ns == 10 * S


def _counters(t_s, link_t_s, crc):
    return model.GpuCounters(
        gpu_uuid="GPU-1",
        sample_unix_ns=int(t_s * S),
        nvlinks=(model.NvLinkCounters(0, True, crc, 0, 0),),
        nvlink_sample_unix_ns=int(link_t_s * S),
    )


def test_a_cached_link_reading_is_not_compared_with_itself():
    assert health.evaluate(_counters(9, 0, 500), _counters(10, 0, 500)) == ()


def test_link_error_rate_uses_the_links_sample_interval():
    # 50 errors over the 10 s between link readings is 5/s: below the default 10/s threshold,
    # although the counters themselves are only 1 s apart.
    assert health.evaluate(_counters(9, 0, 0), _counters(10, 10, 50)) == ()
    (finding,) = health.evaluate(_counters(9, 0, 0), _counters(10, 10, 500))
    assert finding.kind is model.EventKind.NVLINK_ERRORS and "50 errors/s" in finding.message
