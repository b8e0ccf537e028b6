"""Time dilation of the emulated cluster (Gupta et al., "To Infinity and Beyond: Time-Warped
Network Emulation", NSDI 2006; DieCast, NSDI 2008).

With dilation D the harness runs the modelled cluster D times slower than real: every link is
shaped to rate / D with its queue latency x D (the queue holds the same bytes), every replayed
compute time (forward, each layer's backward) is x D, and so are the timers of the systems under
test whose modelled value should hold (batching cycles, time-outs); what is measured is divided
by D. Work the nodes do on their own CPU (copies, packing, top-k, gRPC) is not stretched, so in
modelled time it weighs 1/D of what it weighs on this machine: what a node with cores of its own
sees, instead of 2P processes sharing 2 cores.

Rates and times use tc's notation: "1gbit", "100mbit", "250kbit", "8000bit" (bits per second);
"10ms", "500us", "1s".
"""

import re

_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_TIME_UNITS = {"us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3, "s": 1.0, "sec": 1.0}


def parse_rate(text):
    """Bits per second of a tc rate; raises ValueError (tc's bytes-per-second 'bps' units are
    refused rather than misread)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]+)\s*", text or "")
    if not m or m.group(2).lower() not in _RATE_UNITS:
        raise ValueError("rate %r: expected a number and one of %s" % (
            text, ", ".join(_RATE_UNITS)))
    bits = float(m.group(1)) * _RATE_UNITS[m.group(2).lower()]
    if bits <= 0:
        raise ValueError("rate %r must be positive" % text)
    return bits


def format_rate(bits_per_s):
    """The tc rate string for a number of bits per second (whole kbit where that is exact)."""
    bits = int(round(bits_per_s))
    return "%dkbit" % (bits // 1000) if bits % 1000 == 0 else "%dbit" % bits


def parse_time(text):
    """Seconds of a tc time; raises ValueError."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]+)\s*", text or "")
    if not m or m.group(2).lower() not in _TIME_UNITS:
        raise ValueError("time %r: expected a number and one of %s" % (
            text, ", ".join(_TIME_UNITS)))
    return float(m.group(1)) * _TIME_UNITS[m.group(2).lower()]


def format_time(seconds):
    """The tc time string for a number of seconds, in microseconds."""
    us = seconds * 1e6
    return "%dus" % round(us) if abs(us - round(us)) < 1e-6 else "%.3fus" % us


class Dilation:
    """Factor D >= 1 and the conversions between modelled and real (wall) time."""

    def __init__(self, factor):
        factor = float(factor)
        if not factor >= 1:
            raise ValueError("dilation must be >= 1, got %r" % factor)
        self.factor = factor

    def __repr__(self):
        return "Dilation(%g)" % self.factor

    def link(self, rate, latency):
        """(rate, latency) strings of a link shaped to model `rate` with queue `latency` (as
        given when D = 1)."""
        if self.factor == 1:
            return rate, latency
        return (format_rate(parse_rate(rate) / self.factor),
                format_time(parse_time(latency) * self.factor))

    def wall(self, modelled):
        """A modelled duration (any unit) as the real one."""
        return modelled * self.factor

    def modelled(self, wall):
        """A measured (real) duration as the modelled one."""
        return wall / self.factor


def parse_factors(text):
    """The comma-separated dilation factors of --dilation; raises ValueError."""
    out = []
    for part in (text or "").split(","):
        if part.strip():
            out.append(Dilation(part).factor)
    if not out:
        raise ValueError("no dilation factor given")
    return out
