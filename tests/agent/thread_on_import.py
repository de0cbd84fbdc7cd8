"""A module that starts a thread when imported (a metrics exporter, a connection pool's reaper...)."""

import threading
import time

STARTED = threading.Thread(target=time.sleep, args=(3600,), name="started-at-import", daemon=True)
STARTED.start()
