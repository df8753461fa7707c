"""Every error the runtime raises on purpose, under one base class. Introduced in 07.

An application catches `QttsError` to tell a user's mistake or a missing file from a bug: each message says
what is wrong and what would be valid (the CLI prints it as one line; the server returns it in a 4xx body).
"""
from __future__ import annotations


class QttsError(Exception):
    """Base class of the runtime's own errors."""


class InputError(QttsError, ValueError):
    """Bad user input (text, language, voice, sampling parameters): the message says what is valid."""


class AudioError(QttsError, ValueError):
    """An audio file or voice clip that cannot be used (unreadable, wrong rate, silent, too short...)."""


class MissingArtifact(QttsError, FileNotFoundError):
    """A checkpoint file or an ncnn export is not there: the message names the chapter (or command) that makes it."""


class DeviceError(QttsError, ValueError):
    """A device that is not there or not understood; the message lists what ncnn sees."""


class PrecisionError(QttsError, ValueError):
    """An unknown precision tier, or one the device cannot run; the message lists what can."""


class BatchError(QttsError, ValueError):
    """Batching that this build or device cannot do (an unknown cache layout, a GPU) or was not asked for properly
    (a batch size below 1); the message says what works instead."""
