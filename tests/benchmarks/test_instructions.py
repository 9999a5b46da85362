"""``benchmarks/instructions.py``: callgrind's, ``callgrind_annotate``'s and py-spy's output
read into counts and splits."""

from __future__ import annotations

import pytest

from .loading import load_benchmark

cg = load_benchmark("instructions")

ANNOTATE = """\
--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
1,000,000 (100.0%)  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir                    file:function
--------------------------------------------------------------------------------
600,000 (60.00%)  /tmp/b/Python-3.11.7/Python/ceval.c:_PyEval_EvalFrameDefault'2 [/x/lib/libpython3.11.so.1.0]
200,000 (20.00%)  /tmp/b/Python-3.11.7/./Include/object.h:_PyFrame_Clear
100,000 (10.00%)  /project/uvloop/loop.c:__pyx_f_6uvloop_4loop_6Handle__run [/v/site-packages/uvloop/loop.cpython-311-x86_64-linux-gnu.so]
 60,000 ( 6.00%)  build/__native_ab12.c:CPyDef_route___route [/s/src/ab12__mypyc.cpython-311-x86_64-linux-gnu.so]
 30,000 ( 3.00%)  ./string/../sysdeps/x86_64/multiarch/memmove-vec-unaligned-erms.S:__memcpy_avx_unaligned_erms [/usr/lib/x86_64-linux-gnu/libc.so.6]
 10,000 ( 1.00%)  /opt/_internal/cpython-3.11.16/include/python3.11/object.h:__pyx_f_9httptools_6parser_6parser_cb_on_header_value
"""  # noqa: E501


def test_split_objects_reads_the_total_and_groups_functions_by_their_object() -> None:
    total, objects = cg.split_objects(ANNOTATE)
    assert total == 1_000_000
    assert objects == {
        "interpreter": 800_000,  # the inlined header's line counts with its interpreter
        "uvloop": 100_000,
        "kvgate compiled (mypyc)": 60_000,
        "libc": 30_000,
        "httptools/llhttp": 10_000,  # CPython's header inlined into the extension module
    }
    assert sum(objects.values()) == total


def test_split_objects_refuses_output_without_totals() -> None:
    with pytest.raises(SystemExit):
        cg.split_objects("nothing here\n")


RAW = """\
_run (asyncio/events.py:80);data_received (kvgate/gateway/dataplane/listener.py:259);route (kvgate/core/route.py:120) 5
_run (asyncio/events.py:80);send (kvgate/gateway/dataplane/http_answer.py:114);write (libc.so.6) 3
_run (asyncio/events.py:80);record (kvgate/gateway/observe/logs.py:211);replace (dataclasses.py:1494) 2
uv__run_idle (loop.cpython-311-x86_64-linux-gnu.so) 1
"""  # noqa: E501


def test_split_samples_sets_system_calls_apart_and_groups_by_module() -> None:
    leaf, owner, modules = cg.split_samples(RAW)
    assert leaf == {
        "core": 5,
        "system calls (kernel time)": 3,
        "other Python (stdlib, libraries)": 2,
        "native, no Python frame": 1,
    }
    assert owner == {"core": 5, "gateway/observe": 2, "no kvgate frame": 1}
    assert modules == {"core/route.py": 5, "gateway/observe/logs.py": 2}


def test_object_names_of_a_mypyc_build_are_told_apart() -> None:
    assert cg._object_name("/s/src/kvgate/core/route.cpython-311-x86_64-linux-gnu.so") == (
        "kvgate compiled (mypyc)"
    )
    assert cg._object_name("/v/site-packages/httptools/parser/parser.so") == "httptools/llhttp"


DUMP = """\
# callgrind format
version: 1
creator: callgrind-3.19.0
cmd: python -m kvgate.cli serve
events: Ir
summary: 0

fl=(1) x.c
fn=(1) f
3 604000000
totals: 604000000
"""


def test_dump_total_reads_a_dump_on_request_once_it_is_written_whole() -> None:
    assert cg.dump_total(DUMP) == 604_000_000
    assert cg.dump_total(DUMP.rpartition("totals:")[0]) == 0  # still being written
    assert cg.dump_total(DUMP.replace("summary: 0", "summary: 604000000")) == 604_000_000


STRACE = """\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 45.00    0.001000           0      3000           write
 30.00    0.000600           0      2000           read
 20.00    0.000400           0      2000           epoll_wait
  5.00    0.000100          20         5         1 futex
------ ----------- ----------- --------- --------- ----------------
100.00    0.002100           0      7005         1 total
"""


def test_split_syscalls_counts_calls_per_request_and_drops_the_rare_ones() -> None:
    assert cg.split_syscalls(STRACE, 1000) == {"write": 3.0, "read": 2.0, "epoll_wait": 2.0}
