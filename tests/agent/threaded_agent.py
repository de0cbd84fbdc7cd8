"""An agent whose own module starts a thread at import (tests/agent/test_agent_channels.py)."""

from tests.agent import thread_on_import  # noqa: F401 - the thread is the point
from tests.agent.hostile_agents import agent  # noqa: F401
