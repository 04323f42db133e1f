"""One cloud instance gpuwarden launched or adopted, as the journal and the reaper see it."""

from __future__ import annotations

from dataclasses import dataclass

# EC2 instance states. "Live" instances count against caps and cost money (a stopped instance
# still holds its volumes, and gpuwarden never stops one, so one found stopped is reaped too).
LIVE_STATES: tuple[str, ...] = ("pending", "running", "stopping", "stopped")
ENDED_STATES: tuple[str, ...] = ("shutting-down", "terminated")
# Not an EC2 state: the journal knew the instance, EC2 no longer reports it.
GONE = "gone"


@dataclass(frozen=True, slots=True)
class Managed:
    """An instance gpuwarden owns. Times are on the daemon's clock (epoch seconds)."""

    instance_id: str
    profile: str
    region: str
    instance_type: str
    market: str  # "on-demand" | "spot"
    state: str  # an EC2 state, or GONE
    launched_at: float
    expires_at: float  # launched_at + the profile's ttl: reaped then, incident or not
    host: str
    incident: str | None = None  # None: adopted without an incident tag
    rule: str | None = None
    step: int | None = None
    intent: str | None = None
    subnet: str | None = None
    hourly_usd: float | None = None  # from the profile's price table; None: not priced
    terminated_at: float | None = None
    end_reason: str | None = None  # linger | ttl | orphan | manual | gone | external
    adopted: bool = False  # found in EC2 by its tags, not launched by this journal

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    def cost_so_far(self, now: float) -> float | None:
        """Estimated USD spent: the hourly price times the hours from launch to the end
        (or ``now``). None when the type has no price in the profile."""
        if self.hourly_usd is None:
            return None
        end = self.terminated_at if self.terminated_at is not None else now
        return self.hourly_usd * max(0.0, end - self.launched_at) / 3600.0
