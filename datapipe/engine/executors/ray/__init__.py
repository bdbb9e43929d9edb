"""The Ray executor and everything of Ray it needs: starting or joining Ray (``runtime``), the
raylet's agents' stand-ins (``agent_stub``), the task as a Ray worker runs it (``worker``) and when
a reused worker makes way for a fresh one (``recycle``). Ray is imported nowhere else in datapipe."""
