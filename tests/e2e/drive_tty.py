#!/usr/bin/env python3
"""Drives the kvstream binary as a person at a terminal would, for tests/e2e/test_llama_flags.cpp.

  drive_tty.py chat BINARY MODEL   a chat in a pty: a line, a second line interrupted by Ctrl-C
                                   during its answer, a third line, Ctrl-C at the prompt, Ctrl-D
  drive_tty.py sigint BINARY ARGS  `kvstream ARGS` with Ctrl-C (SIGINT) once text comes out
  drive_tty.py progress BINARY ARGS  `kvstream ARGS` with stderr on a pty

Prints one JSON object: the exit status and what the program wrote.
"""
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time


def read_until(fd, want, timeout, buf):
    """Reads from fd into buf until `want` (bytes) is in the new part or timeout; True if found."""
    start = len(buf)
    end = time.time() + timeout
    while time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.1)
        if not r:
            continue
        try:
            data = os.read(fd, 4096)
        except OSError:
            return False
        if not data:
            return False
        buf += data
        if want in buf[start:]:
            return True
    return False


def wait_exit(pid, fd, buf, timeout):
    end = time.time() + timeout
    while time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                data = os.read(fd, 4096)
                buf += data
            except OSError:
                pass
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def chat(binary, model):
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(binary, [binary, "chat", "-m", model, "--temp", "0", "-n", "48",
                          "--ignore-eos", "-c", "1024", "-t", "2"])
    buf = bytearray()
    steps = {}
    steps["prompt1"] = read_until(fd, b"> ", 60, buf)
    os.write(fd, b"Name three colours.\n")
    steps["answer1"] = read_until(fd, b"\n> ", 60, buf)
    os.write(fd, b"Tell me a long story about a lighthouse.\n")
    # Ctrl-C once the answer has started (a few characters after the echoed line).
    steps["answer2_started"] = read_until(fd, b"lighthouse.\r\n", 30, buf) and \
        read_until(fd, b" ", 30, buf)
    os.write(fd, b"\x03")
    steps["stopped"] = read_until(fd, b"\n> ", 30, buf)
    os.write(fd, b"Say hello.\n")
    steps["answer3"] = read_until(fd, b"\n> ", 60, buf)
    # Ctrl-C at the prompt drops the line being typed; the chat goes on.
    os.write(fd, b"half a line")
    time.sleep(0.2)
    os.write(fd, b"\x03")
    steps["prompt_after_ctrl_c"] = read_until(fd, b"\n> ", 10, buf)
    os.write(fd, b"\x04")
    status = wait_exit(pid, fd, buf, 30)
    return {"status": status, "steps": steps, "output": buf.decode("utf-8", "replace")}


def sigint(binary, args):
    p = subprocess.Popen([binary] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # Wait for the first generated text, then Ctrl-C.
    first = p.stdout.read(1)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    return {"status": p.returncode, "stdout": (first + out).decode("utf-8", "replace"),
            "stderr": err.decode("utf-8", "replace")}


def progress(binary, args):
    master, slave = pty.openpty()
    p = subprocess.Popen([binary] + args, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    buf = bytearray()
    while True:
        r, _, _ = select.select([master], [], [], 0.2)
        if r:
            try:
                data = os.read(master, 4096)
            except OSError:
                break
            if not data:
                break
            buf += data
        elif p.poll() is not None:
            break
    p.wait(timeout=120)
    return {"status": p.returncode, "stderr": buf.decode("utf-8", "replace")}


def main():
    mode, binary = sys.argv[1], sys.argv[2]
    if mode == "chat":
        r = chat(binary, sys.argv[3])
    elif mode == "sigint":
        r = sigint(binary, sys.argv[3:])
    else:
        r = progress(binary, sys.argv[3:])
    print(json.dumps(r))


if __name__ == "__main__":
    main()
