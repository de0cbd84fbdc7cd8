"""Imported in the agent host (its warm-up imports what the first sessions imported late), this
writes a garbage frame to every pipe and socket the host holds open for writing: the driver's among
them. Imported anywhere else (a session's own process), it does nothing."""

import fcntl
import os
import stat

if os.getppid() == int(os.environ.get("SEER_TEST_DRIVER_PID", "-1")):
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd < 3 or not (stat.S_ISFIFO(os.fstat(fd).st_mode) or stat.S_ISSOCK(os.fstat(fd).st_mode)):
                continue
            if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
                continue
            os.write(fd, b"\xff\xff\xff\xffnot a frame")
        except OSError:
            pass
