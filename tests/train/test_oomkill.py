"""A training process killed by the kernel's out-of-memory killer is told from one killed
otherwise by the kernel's own count: its memory cgroup's oom_kill (cgroup v2's
memory.events, v1's memory.oom_control), or the kernel log's line for its pid. Here on
files laid out as /proc and /sys lay them out; tests/e2e/test_resource_faults.py has the
kernel do it."""

from automlperf.train.oomkill import MemoryGroup, OomWatch, kernel_log_kill, memory_group

V2_MOUNTS = "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
V1_MOUNTS = ("30 23 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
             "34 23 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n")


def _proc(tmp_path, pid, cgroup, mounts):
    (tmp_path / "proc" / str(pid)).mkdir(parents=True)
    (tmp_path / "proc" / str(pid) / "cgroup").write_text(cgroup)
    (tmp_path / "mountinfo").write_text(mounts)
    return tmp_path / "proc", tmp_path / "mountinfo"


def test_the_memory_cgroup_of_a_process_on_either_version(tmp_path):
    root = tmp_path / "sys"
    v2 = root / "slurm" / "job_7"
    v2.mkdir(parents=True)
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (v2 / "memory.max").write_text("2147483648\n")
    proc, mounts = _proc(tmp_path, 11, "0::/slurm/job_7\n",
                         V2_MOUNTS.replace("/sys/fs/cgroup", str(root)))
    group = memory_group(11, proc, mounts)
    assert group == MemoryGroup(v2 / "memory.events", "/slurm/job_7", 2 << 30)
    assert group.kills() == 1 and "limit 2.0 GiB" in group.describe()

    v1 = tmp_path / "v1" / "memory" / "docker" / "abc"
    v1.mkdir(parents=True)
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n")
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # unlimited
    proc, mounts = _proc(tmp_path / "b", 12, "4:memory:/docker/abc\n0::/\n",
                         V1_MOUNTS.replace("/sys/fs/cgroup", str(tmp_path / "v1")))
    group = memory_group(12, proc, mounts)
    assert group is not None and group.kills() == 4 and group.limit is None
    # Neither readable: no group, and the death is judged by the kernel log alone.
    assert memory_group(13, proc, mounts) is None


def test_only_a_count_that_rose_with_signal_9_is_an_oom_kill(tmp_path):
    events = tmp_path / "memory.events"
    events.write_text("oom_kill 2\n")
    # A pid above any kernel's limit: the kernel log cannot name it either.
    watch = OomWatch(999_999_999, MemoryGroup(events, "/job", 1 << 30))
    watch.arm()
    assert watch.killed(-9) is None  # killed, but not for memory: the count did not rise
    events.write_text("oom_kill 3\n")
    assert watch.killed(1) is None and watch.killed(-11) is None  # not a SIGKILL
    said = watch.killed(-9)
    assert said is not None and "out-of-memory killer" in said and "1 process(es)" in said


def test_the_kernel_log_names_the_process_it_killed(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text("6,1,2,-;Memory cgroup out of memory: Killed process 4242 (python3) "
                   "total-vm:630968kB\n")
    assert kernel_log_kill(4242, str(log)) is True
    assert kernel_log_kill(424, str(log)) is False
    assert kernel_log_kill(4242, str(tmp_path / "absent")) is None


def test_a_kill_the_log_recorded_before_the_watch_was_armed_is_not_this_process(tmp_path):
    """The kernel log keeps the kills of earlier processes, one of which may have had this
    pid: only what it records after the watch was armed names this process."""
    log = tmp_path / "kmsg"
    log.write_text("6,1,2,-;Memory cgroup out of memory: Killed process 4242 (python3)\n")
    watch = OomWatch(4242, None, kmsg=str(log))
    watch.arm()
    assert watch.killed(-9) is None and watch.killed(-9, log_first=True) is None
    with log.open("a") as f:
        f.write("6,2,3,-;Memory cgroup out of memory: Killed process 4243 (python3)\n")
    assert watch.killed(-9) is None
    with log.open("a") as f:
        f.write("6,3,4,-;oom-kill:constraint=CONSTRAINT_MEMCG,task=python3,pid=4242,uid=0\n")
    assert "kernel log" in watch.killed(-9, log_first=True)
    assert "kernel log" in watch.killed(-9)  # asked again: still so
    watch.close()
    # Never armed: the whole log is all there is to go by.
    assert "kernel log" in OomWatch(4242, None, kmsg=str(log)).killed(-9)
