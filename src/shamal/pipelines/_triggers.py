"""What starts pipeline runs by itself: cron schedules and events.

A schedule's last tick is moved by compare-and-set before its run starts, and every run a
trigger starts carries a key unique per pipeline (``schedule:<n>:<tick>``,
``event:<n>:<id>``): two servers never fire one tick or start two runs for one event, and an
event handed out again (at-least-once delivery) starts nothing new. A scheduled run never
overlaps the last one: while it runs, the next tick is skipped (and logged). Runs act as the
user who registered the pipeline's newest version.

No loops: a pipeline is never started by an event that it caused. Its own ticks and runs
name it in their payload (``pipeline``); an event a step's job caused (a dataset version it
wrote with its job token) carries ``job``, the job id's prefix that the platform reads from
the token's stored name, never from the caller, and the pipelines store says which
pipeline's run that job is a step of. Other pipelines subscribed to the same event still
start: pipeline A writing data may start pipeline B, which is what events are for (a cycle
A -> B -> A is the definitions' business, not stopped here).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from shamal.clock import Clock
from shamal.db import Database
from shamal.errors import ShamalError
from shamal.events import Event, EventFilter, EventKind, EventService, NewEvent, emit
from shamal.pipelines import _store
from shamal.pipelines._cron import CronSchedule, due_ticks
from shamal.pipelines._definitions import PipelineSpec, Trigger
from shamal.pipelines._entities import PipelineInfo
from shamal.pipelines._service import PipelineService
from shamal.security import AuditContext, SecurityService

logger = logging.getLogger(__name__)

#: The consumer of the event stream that starts pipelines.
CONSUMER = "pipelines.triggers"


def check_trigger(data: Mapping[str, Any]) -> None:
    """Raises InvalidParameter for a trigger that cannot work: an event filter or a cron
    expression (with its time zone) that does not parse."""
    trigger = Trigger.from_json("trigger", data)
    if trigger.on is not None:
        EventFilter.parse(trigger.on)
    else:
        assert trigger.schedule is not None
        CronSchedule.parse(trigger.schedule, trigger.timezone)


@dataclass(frozen=True, slots=True)
class _Subscription:
    pipeline: PipelineInfo
    index: int
    trigger: Trigger
    filter: EventFilter


class PipelineTriggers:
    """Fires schedules and turns events into runs; the scheduler loop calls both."""

    def __init__(
        self,
        db: Database,
        security: SecurityService,
        pipelines: PipelineService,
        events: EventService,
        clock: Clock,
    ) -> None:
        self._db = db
        self._security = security
        self._pipelines = pipelines
        self._events = events
        self._clock = clock

    def _context(self, info: PipelineInfo, what: str) -> AuditContext:
        principal = self._security.principal_of(info.owner)
        return AuditContext(action="pipeline.run", actor=what, principal=principal)

    def _triggered(self) -> list[PipelineInfo]:
        with self._db.unit_of_work(write=False) as s:
            return _store.triggered_pipelines(s)

    # ------------------------------------------------------------------ schedules
    def fire_schedules(self) -> int:
        """Start the runs every schedule owes now; how many started."""
        started = 0
        for info in self._triggered():
            spec = PipelineSpec.from_json(info.spec)
            for index, trigger in enumerate(spec.triggers):
                if trigger.schedule is None:
                    continue
                try:
                    started += self._fire(info, index, trigger)
                except ShamalError as exc:
                    logger.warning("schedule %d of pipeline %s: %s", index, info.name, exc)
        return started

    def _fire(self, info: PipelineInfo, index: int, trigger: Trigger) -> int:
        assert trigger.schedule is not None
        schedule = CronSchedule.parse(trigger.schedule, trigger.timezone)
        expression = f"{schedule} {trigger.timezone} {trigger.catch_up}"
        now = self._clock()
        with self._db.unit_of_work(write=False) as s:
            last = _store.last_tick(s, info.name, index)
        if last is None or last[0] != expression:
            # A new (or changed) schedule counts from now: nothing in its past is owed.
            previous = None if last is None else last[1]
            self._db.run(lambda s: _store.move_tick(s, info.name, index, expression, previous, now))
            return 0
        current = last[1]
        started = 0
        for tick in due_ticks(schedule, last_tick=current, now=now, catch_up=trigger.catch_up):
            take = functools.partial(
                self._take_tick,
                info=info,
                index=index,
                expression=expression,
                previous=current,
                tick=tick,
            )
            fired = self._start_scheduled(info, index, trigger, tick, take)
            if fired is None:
                return started  # another server fired it
            current = tick
            started += fired
        if started == 0 and current != last[1]:
            logger.info("pipeline %s: schedule %d moved to %s", info.name, index, current)
        return started

    def _take_tick(
        self,
        s: Session,
        *,
        info: PipelineInfo,
        index: int,
        expression: str,
        previous: datetime,
        tick: datetime,
    ) -> bool:
        if not _store.move_tick(s, info.name, index, expression, previous, tick):
            return False
        emit(
            s,
            NewEvent(
                EventKind.SCHEDULE_FIRED,
                f"pipelines:/{info.name}",
                info.team or None,
                "scheduler",
                {"pipeline": info.name, "schedule": expression, "tick": tick.isoformat()},
            ),
        )
        return True

    def _start_scheduled(
        self,
        info: PipelineInfo,
        index: int,
        trigger: Trigger,
        tick: datetime,
        take: Callable[[Session], bool],
    ) -> int | None:
        """Fire ``tick``: its run is recorded in the transaction that moves the tick (a
        server that dies in between leaves both undone, and the next one fires the tick);
        1 when it started a run, 0 when the tick was skipped (the last scheduled run still
        runs), None when another server had fired it."""
        with self._db.unit_of_work(write=False) as s:
            running = _store.running_scheduled(s, info.name)
        if running is not None:
            logger.warning(
                "pipeline %s: the tick of %s is skipped, run %s (scheduled) still runs",
                info.name,
                tick.isoformat(),
                running,
            )
            return 0 if self._db.run(take) else None
        ctx = self._context(info, f"schedule:{info.name}")
        run = self._pipelines.start(
            ctx,
            info.name,
            trigger.params,
            trigger=f"schedule {trigger.schedule} at {tick.isoformat()}",
            trigger_key=f"schedule:{index}:{tick.isoformat()}",
            with_run=take,
        )
        return None if run is None else 1

    # ------------------------------------------------------------------ events
    def consume_events(self) -> int:
        """Hand the events since the last call to :meth:`on_events`; how many were read."""
        return self._events.consume(CONSUMER, self.on_events)

    def on_events(self, events: Sequence[Event]) -> None:
        """Start a run for each event a pipeline's ``on`` filter matches (once per event:
        a batch handed out again starts nothing new), unless the pipeline caused it."""
        subscriptions = self._subscriptions()
        causes: dict[str, set[str]] = {}
        for event in events:
            for sub in subscriptions:
                if self._wants(sub, event) and not self._caused(sub, event, causes):
                    self._start_for(sub, event)

    def _subscriptions(self) -> list[_Subscription]:
        found = []
        for info in self._triggered():
            spec = PipelineSpec.from_json(info.spec)
            for index, trigger in enumerate(spec.triggers):
                if trigger.on is not None:
                    found.append(_Subscription(info, index, trigger, EventFilter.parse(trigger.on)))
        return found

    @staticmethod
    def _wants(sub: _Subscription, event: Event) -> bool:
        if event.payload.get("pipeline") == sub.pipeline.name:
            return False  # its own runs and ticks never start it again (no loops)
        if event.team is not None and event.team != sub.pipeline.team:
            return False  # one team's events never start another team's pipeline
        return sub.filter.matches(event)

    def _caused(self, sub: _Subscription, event: Event, causes: dict[str, set[str]]) -> bool:
        """Whether one of ``sub``'s pipeline's runs caused ``event``: its payload names a
        job (``job``) that is a step of such a run. ``causes`` keeps each job's pipelines
        for the batch."""
        job = event.payload.get("job")
        if not isinstance(job, str):
            return False
        if job not in causes:
            with self._db.unit_of_work(write=False) as s:
                causes[job] = _store.pipelines_of_job(s, job)
        if sub.pipeline.name not in causes[job]:
            return False
        logger.info(
            "event %d does not start pipeline %s: its own run's job %s caused it",
            event.id,
            sub.pipeline.name,
            job,
        )
        return True

    def _start_for(self, sub: _Subscription, event: Event) -> None:
        try:
            ctx = self._context(sub.pipeline, f"event:{event.id}")
            self._pipelines.start(
                ctx,
                sub.pipeline.name,
                sub.trigger.params,
                trigger=f"event {event.kind.value} #{event.id}",
                trigger_key=f"event:{sub.index}:{event.id}",
            )
        except ShamalError as exc:  # a broken pipeline must not hold up the stream
            logger.warning(
                "event %d did not start pipeline %s: %s", event.id, sub.pipeline.name, exc
            )
