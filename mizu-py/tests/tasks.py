"""Functions the tests run in worker processes (importable there via PYTHONPATH)."""

import os
import time


def add(a, b):
    return a + b


def boom(msg):
    raise ValueError(msg)


class Unpicklable(Exception):
    def __init__(self):
        super().__init__("cannot travel")
        self.lock = __import__("threading").Lock()


def raise_unpicklable():
    raise Unpicklable()


def die():
    os._exit(3)


def pid():
    return os.getpid()


def sleep(s):
    time.sleep(s)
    return s


def big(n):
    return b"x" * n
