--------------------------------------------------------------------------------
-- Cron schedules: a named schedule enqueues a job at the times a cron expression
-- names, read on the wall clock of a time zone.
--
-- A schedule rides on the periodic mechanism: it has one current occurrence, a
-- job (jobs.schedule names the schedule), and the statement that finishes that
-- occurrence (complete, fail for good, cancel) inserts the next one
-- (treadle._follow_up -> treadle._schedule_next). Claims never look at schedules.
--
-- The rules, documented in docs/scheduling.md:
--   cron: five fields (minute hour day-of-month month day-of-week) with *, ranges
--     a-b, steps */n a-b/n a/n, lists, month and weekday names, 0 or 7 for Sunday,
--     or @yearly @annually @monthly @weekly @daily @midnight @hourly. When both
--     day fields are restricted (neither starts with *), a day matches either
--     (Vixie cron).
--   time zones: times are read on the zone's wall clock. A job at fixed hours
--     (30 2 * * *, 0 */2 * * *) runs once on each day it names: a time that a
--     spring-forward change skips runs at the instant the clocks jump (the
--     skipped times of one change run together, once), a time that a fall-back
--     change repeats runs at its first pass only. A job whose hour field is *
--     (hourly, every 5 minutes) follows real time instead: its skipped times do
--     not run, and it runs in both passes of a repeated hour.
--   missed times: an occurrence that runs late (no worker for a day) runs once,
--     and the next one is the first time after it finished; with catch_up, every
--     missed time runs, one after another.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._cron_field(field, field_no) -> integer[]
--
-- The values one cron field allows, sorted: field_no 1 minute (0-59), 2 hour
-- (0-23), 3 day of month (1-31), 4 month (1-12 or jan-dec), 5 day of week (0-7
-- or sun-sat, 7 read as 0). Raises 22023 for anything else.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._cron_field(field text, field_no integer)
RETURNS integer[]
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c_what  CONSTANT text[] := ARRAY['minute', 'hour', 'day of month', 'month', 'day of week'];
    c_low   CONSTANT integer[] := ARRAY[0, 0, 1, 1, 0];
    c_high  CONSTANT integer[] := ARRAY[59, 23, 31, 12, 7];
    c_names CONSTANT text[] := CASE field_no
        WHEN 4 THEN ARRAY['jan', 'feb', 'mar', 'apr', 'may', 'jun', 'jul', 'aug', 'sep', 'oct', 'nov', 'dec']
        WHEN 5 THEN ARRAY['sun', 'mon', 'tue', 'wed', 'thu', 'fri', 'sat']
        END;
    v_low    integer := c_low[field_no];
    v_high   integer := c_high[field_no];
    v_values integer[] := '{}'::integer[];
    v_item   text;
    v_parts  text[];
    v_from   integer;
    v_to     integer;
    v_step   integer;
BEGIN
    FOREACH v_item IN ARRAY string_to_array(field, ',') LOOP
        -- *, a, a-b, each with an optional /step
        v_parts := regexp_match(lower(v_item), '^(\*|([0-9]{1,2}|[a-z]{3})(-([0-9]{1,2}|[a-z]{3}))?)(/([0-9]{1,2}))?$');
        IF v_parts IS NULL THEN
            RAISE EXCEPTION 'treadle: cron % field "%" is not *, a number, a range or a list of them', c_what[field_no], field
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF v_parts[1] = '*' THEN
            v_from := v_low;
            v_to := CASE field_no WHEN 5 THEN 6 ELSE v_high END;
        ELSE
            v_from := CASE WHEN v_parts[2] ~ '^[0-9]' THEN v_parts[2]::integer
                           ELSE array_position(c_names, v_parts[2]) - 1 + v_low END;
            v_to := CASE WHEN v_parts[4] IS NULL THEN v_from
                         WHEN v_parts[4] ~ '^[0-9]' THEN v_parts[4]::integer
                         ELSE array_position(c_names, v_parts[4]) - 1 + v_low END;
            -- a weekday range may end on Sunday: fri-sun, 5-0
            IF field_no = 5 AND v_parts[4] IS NOT NULL AND v_to = 0 AND v_from > 0 THEN
                v_to := 7;
            END IF;
            -- a/n: from a to the end of the field
            IF v_parts[4] IS NULL AND v_parts[6] IS NOT NULL THEN
                v_to := CASE field_no WHEN 5 THEN 6 ELSE v_high END;
            END IF;
        END IF;
        v_step := coalesce(v_parts[6]::integer, 1);
        IF v_from IS NULL OR v_to IS NULL OR v_from < v_low OR v_to > v_high OR v_from > v_to
           OR v_step < 1 OR v_step > v_high - v_low + 1 THEN
            RAISE EXCEPTION 'treadle: cron % field "%" has "%": values must be % to %, ranges low-high, steps 1 to %',
                            c_what[field_no], field, v_item, v_low, v_high, v_high - v_low + 1
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = coalesce('Names: ' || array_to_string(c_names, ' ') || '.',
                                      format('Values %s to %s.', v_low, v_high));
        END IF;
        v_values := v_values || ARRAY(SELECT g FROM generate_series(v_from, v_to, v_step) AS g);
    END LOOP;
    IF field_no = 5 THEN
        v_values := array_replace(v_values, 7, 0);
    END IF;
    RETURN ARRAY(SELECT DISTINCT v FROM unnest(v_values) AS u(v) ORDER BY v);
END;
$$;
COMMENT ON FUNCTION treadle._cron_field(text, integer) IS
    'The sorted values one cron field allows (1 minute .. 5 day of week); 22023 for a bad field.';

--------------------------------------------------------------------------------
-- treadle._cron_parse(cron) -> (minutes, hours, days, months, weekdays, day_or,
--                               real_time)
--
-- A cron expression's five fields as value lists (weekdays 0-6, Sunday 0).
-- day_or: both day fields are restricted, so a day matches either of them.
-- real_time: the hour field is *, so across a change of the clocks the
-- job follows real time (skipped times do not run, repeated ones run twice).
-- Raises 22023: not five fields or a macro, or a bad field.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._cron_parse(
    cron            text,
    OUT minutes     integer[],
    OUT hours       integer[],
    OUT days        integer[],
    OUT months      integer[],
    OUT weekdays    integer[],
    OUT day_or      boolean,
    OUT real_time   boolean
)
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_fields text[];
BEGIN
    v_fields := regexp_split_to_array(btrim(CASE lower(btrim(cron))
        WHEN '@yearly' THEN '0 0 1 1 *'
        WHEN '@annually' THEN '0 0 1 1 *'
        WHEN '@monthly' THEN '0 0 1 * *'
        WHEN '@weekly' THEN '0 0 * * 0'
        WHEN '@daily' THEN '0 0 * * *'
        WHEN '@midnight' THEN '0 0 * * *'
        WHEN '@hourly' THEN '0 * * * *'
        ELSE cron END), ' +');
    IF cardinality(v_fields) <> 5 THEN
        RAISE EXCEPTION 'treadle: cron must have five fields (minute hour day-of-month month day-of-week) or be a macro, got "%"', cron
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Macros: @yearly @annually @monthly @weekly @daily @midnight @hourly.';
    END IF;
    minutes := treadle._cron_field(v_fields[1], 1);
    hours := treadle._cron_field(v_fields[2], 2);
    days := treadle._cron_field(v_fields[3], 3);
    months := treadle._cron_field(v_fields[4], 4);
    weekdays := treadle._cron_field(v_fields[5], 5);
    day_or := left(v_fields[3], 1) <> '*' AND left(v_fields[5], 1) <> '*';
    real_time := v_fields[2] = '*';
END;
$$;
COMMENT ON FUNCTION treadle._cron_parse(text) IS
    'Parse a cron expression into its value lists and day and DST rules; 22023 for a bad one.';

--------------------------------------------------------------------------------
-- treadle._cron_day(day, days, weekdays, day_or) -> boolean
--
-- Whether a date matches cron's day fields: both (day of month and day of
-- week), or with day_or either one.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._cron_day(day date, days integer[], weekdays integer[], day_or boolean)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
BEGIN ATOMIC
    SELECT CASE WHEN day_or
                THEN extract(day FROM day)::integer = ANY (days) OR extract(dow FROM day)::integer = ANY (weekdays)
                ELSE extract(day FROM day)::integer = ANY (days) AND extract(dow FROM day)::integer = ANY (weekdays) END;
END;
COMMENT ON FUNCTION treadle._cron_day(date, integer[], integer[], boolean) IS
    'Whether a date matches cron''s day-of-month and day-of-week fields (both, or either with day_or).';

--------------------------------------------------------------------------------
-- treadle._utc_offset(at, tz) -> interval
--
-- The offset from UTC of zone tz at instant at (positive east of Greenwich).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._utc_offset(at timestamptz, tz text)
RETURNS interval
LANGUAGE sql
STABLE
BEGIN ATOMIC
    SELECT (at AT TIME ZONE tz) - (at AT TIME ZONE 'UTC');
END;
COMMENT ON FUNCTION treadle._utc_offset(timestamptz, text) IS
    'The UTC offset of a time zone at an instant.';

--------------------------------------------------------------------------------
-- treadle._wall_instant(wall, tz, last_pass) -> timestamptz
--
-- The instant when the clocks of zone tz show wall. A wall time that a change
-- skips maps to the instant the clocks jump; one that a change repeats maps to
-- its first pass, or to its second with last_pass.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._wall_instant(wall timestamp, tz text, last_pass boolean)
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- the offsets a day either side: a wall time near a change is one of them
    v_before timestamptz := (wall - treadle._utc_offset((wall - interval '1 day') AT TIME ZONE 'UTC', tz)) AT TIME ZONE 'UTC';
    v_after  timestamptz := (wall - treadle._utc_offset((wall + interval '1 day') AT TIME ZONE 'UTC', tz)) AT TIME ZONE 'UTC';
    v_low    timestamptz;
    v_high   timestamptz;
    v_mid    timestamptz;
BEGIN
    IF (v_before AT TIME ZONE tz) = wall AND (v_after AT TIME ZONE tz) = wall THEN
        RETURN CASE WHEN last_pass THEN greatest(v_before, v_after) ELSE least(v_before, v_after) END;
    ELSIF (v_before AT TIME ZONE tz) = wall THEN
        RETURN v_before;
    ELSIF (v_after AT TIME ZONE tz) = wall THEN
        RETURN v_after;
    END IF;
    -- Skipped: the clocks jump over wall between the two readings (v_after shows
    -- a time before wall, v_before one after it). Find the jump to the second.
    v_low := least(v_before, v_after);
    v_high := greatest(v_before, v_after);
    WHILE v_high - v_low > interval '1 second' LOOP
        v_mid := date_trunc('second', v_low + (v_high - v_low) / 2);
        IF (v_mid AT TIME ZONE tz) > wall THEN
            v_high := v_mid;
        ELSE
            v_low := v_mid;
        END IF;
    END LOOP;
    RETURN v_high;
END;
$$;
COMMENT ON FUNCTION treadle._wall_instant(timestamp, text, boolean) IS
    'The instant a zone''s clocks show a wall time (a skipped one: when they jump; a repeated one: its first or last pass).';

--------------------------------------------------------------------------------
-- treadle._cron_next(cron, tz, after) -> timestamptz
--
-- The first instant after `after` that cron names on the wall clock of zone tz,
-- by the rules at the top of this file; null when there is none within 10
-- years (February 30th). tz is not checked here (treadle._check_tz).
-- Raises 22023: a bad cron expression.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._cron_next(cron text, tz text, after timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_cron  record;
    v_best  timestamptz;
    v_found timestamptz;
    v_last  boolean;
    v_wall  timestamp;
    v_limit timestamp := (after AT TIME ZONE tz) + interval '10 years';
    v_min   integer;
BEGIN
    SELECT * INTO v_cron FROM treadle._cron_parse(cron);
    -- Walk the wall-clock times that match, mapping each to an instant: its first
    -- pass, then (for a job that follows real time) its last pass too, and keep
    -- the earlier result. The first-pass walk starts at the wall time of `after`;
    -- the last-pass walk three hours earlier, since a repeated hour's second pass
    -- comes after the first passes of later wall times.
    FOREACH v_last IN ARRAY CASE WHEN v_cron.real_time THEN ARRAY[false, true] ELSE ARRAY[false] END LOOP
        v_found := NULL;
        v_wall := date_trunc('minute', after AT TIME ZONE tz)
                  - CASE WHEN v_last THEN interval '3 hours' ELSE interval '0' END;
        WHILE v_found IS NULL AND v_wall <= v_limit LOOP
            IF extract(month FROM v_wall)::integer <> ALL (v_cron.months) THEN
                v_wall := date_trunc('month', v_wall) + interval '1 month';
            ELSIF NOT treadle._cron_day(v_wall::date, v_cron.days, v_cron.weekdays, v_cron.day_or) THEN
                v_wall := date_trunc('day', v_wall) + interval '1 day';
            ELSIF extract(hour FROM v_wall)::integer <> ALL (v_cron.hours) THEN
                v_wall := date_trunc('hour', v_wall) + interval '1 hour';
            ELSE
                SELECT min(m) INTO v_min FROM unnest(v_cron.minutes) AS u(m) WHERE m >= extract(minute FROM v_wall);
                IF v_min IS NULL THEN
                    v_wall := date_trunc('hour', v_wall) + interval '1 hour';
                ELSE
                    v_wall := date_trunc('hour', v_wall) + make_interval(mins => v_min);
                    v_found := treadle._wall_instant(v_wall, tz, v_last);
                    -- a skipped time (the clocks jumped over it) of a job that follows real time
                    IF v_found <= after OR (v_cron.real_time AND (v_found AT TIME ZONE tz) <> v_wall) THEN
                        v_found := NULL;
                        v_wall := v_wall + interval '1 minute';
                    END IF;
                END IF;
            END IF;
        END LOOP;
        v_best := least(v_best, v_found);
    END LOOP;
    RETURN v_best;
END;
$$;
COMMENT ON FUNCTION treadle._cron_next(text, text, timestamptz) IS
    'The first instant after a given one that a cron expression names in a time zone; null when none within 10 years.';

--------------------------------------------------------------------------------
-- treadle._check_tz(tz) -> void
--
-- A time zone name that pg_timezone_names lists (Europe/Paris, UTC; any case, as
-- PostgreSQL reads names), read as that zone. Anything else is refused: names
-- PostgreSQL would read as a fixed abbreviation (CET, EST, though listed there
-- too) or as a POSIX rule (UTC+3, whose sign is the reverse of ISO's; Foo/Bar+5),
-- which do not follow a place's summer time, and zones that count leap seconds
-- (right/UTC), whose minutes are not the clock's. Reading pg_timezone_names
-- costs tens of milliseconds, so only a name with a digit (the only names a POSIX
-- rule can take: Etc/GMT+5 is a zone, Foo/Bar+5 a rule) is looked up there; any
-- other name that PostgreSQL reads at all is a zone file, and its offset on
-- 2000-01-01 in whole minutes tells a leap-second zone from the others (the test
-- pg_timezone_names applies).
-- Raises 22004: tz null. 22023: any other name.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_tz(tz text)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ok boolean;
BEGIN
    IF tz IS NULL THEN
        RAISE EXCEPTION 'treadle: tz must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    v_ok := length(tz) <= 100 AND tz ~ '^[A-Za-z_]+(/[A-Za-z0-9_+-]+)*$'
            -- a name that is also an abbreviation (CET, EST) is read as the abbreviation
            AND NOT (tz !~ '/' AND upper(tz) NOT IN ('UTC', 'GMT')
                     AND EXISTS (SELECT 1 FROM pg_catalog.pg_timezone_abbrevs AS a WHERE a.abbrev = upper(tz)));
    IF v_ok THEN
        BEGIN
            v_ok := extract(second FROM timestamptz '2000-01-01 00:00:00+00' AT TIME ZONE tz) = 0;
        EXCEPTION WHEN invalid_parameter_value THEN
            v_ok := false;
        END;
    END IF;
    IF v_ok AND tz ~ '[0-9]' THEN
        v_ok := EXISTS (SELECT 1 FROM pg_catalog.pg_timezone_names AS z WHERE lower(z.name) = lower(tz));
    END IF;
    IF NOT v_ok THEN
        RAISE EXCEPTION 'treadle: tz must name a time zone such as Europe/Paris or UTC, got "%"', tz
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use a name from pg_timezone_names; abbreviations, POSIX rules and leap-second zones do not keep the clock.';
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._check_tz(text) IS
    'Raise 22004 for a null time zone, 22023 for one that is not a known IANA zone name.';

--------------------------------------------------------------------------------
-- treadle.cron_next(cron, tz, after) -> timestamptz
--
-- Read only: the first time after `after` that a cron expression names on the
-- wall clock of zone tz (docs/scheduling.md has the rules); null when there is
-- none within 10 years. What a schedule with this expression would do. It runs
-- as the owner only to reach the private parser; it reads no table and writes
-- nothing, so anyone may call it.
-- Raises 22004: an argument null. 22023: a bad cron expression or time zone;
-- after outside the years 1 to 9999.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.cron_next(cron text, tz text DEFAULT 'UTC', after timestamptz DEFAULT treadle.now())
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM treadle._check_text(cron, 'cron');
    PERFORM treadle._check_tz(tz);
    IF after IS NULL THEN
        RAISE EXCEPTION 'treadle: after must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT (after BETWEEN timestamptz '0001-01-02 00:00:00+00' AND timestamptz '9989-01-01 00:00:00+00') THEN
        RAISE EXCEPTION 'treadle: after must be in the years 1 to 9988, got %', after
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN treadle._cron_next(cron, tz, after);
END;
$$;
COMMENT ON FUNCTION treadle.cron_next(text, text, timestamptz) IS
    'The next time a cron expression names in a time zone, after a given time (read only).';

--------------------------------------------------------------------------------
-- treadle._schedule_next(occurrence treadle.jobs) -> void
--
-- Transition, called by treadle._follow_up when a schedule's occurrence is
-- completed, discarded or cancelled: (none) -> available, the schedule's next
-- occurrence, due at the next time its cron names after the finished one's time
-- (after the finish too, unless catch_up). Only the schedule's current
-- occurrence starts another, once: an occurrence of a schedule that was since
-- unscheduled or replaced, or one retried after it started its successor,
-- starts nothing. Locks the job first, then the schedule, as every writer does.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._schedule_next(occurrence treadle.jobs)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_schedule treadle.cron_schedules;
    v_at       timestamptz;
    v_id       bigint;
BEGIN
    SELECT s.* INTO v_schedule FROM treadle.cron_schedules AS s
     WHERE s.name = occurrence.schedule AND s.job_id = occurrence.id
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    v_at := treadle._cron_next(v_schedule.cron, v_schedule.tz,
                               CASE WHEN v_schedule.catch_up THEN v_schedule.next_run_at
                                    ELSE greatest(v_schedule.next_run_at, occurrence.finished_at) END);
    IF v_at IS NULL THEN
        RETURN;  -- no time within ten years: treadle.schedule refuses such expressions
    END IF;
    -- (a missed time is due at once: treadle._successor wakes the queue)
    v_id := treadle._successor(occurrence.id, v_schedule.queue, v_schedule.job, v_schedule.args,
                               v_schedule.priority, v_at, v_schedule.max_attempts, NULL, v_schedule.name);
    IF v_id IS NULL THEN
        RETURN;
    END IF;
    UPDATE treadle.cron_schedules AS s SET job_id = v_id, next_run_at = v_at WHERE s.name = v_schedule.name;
END;
$$;
COMMENT ON FUNCTION treadle._schedule_next(treadle.jobs) IS
    'Insert a schedule''s next occurrence after its current one finished.';

--------------------------------------------------------------------------------
-- treadle._lock_schedule(name) -> treadle.cron_schedules
--
-- The schedule named `name`, locked, after its current occurrence's job row:
-- the order in which finishing an occurrence locks them too, so a schedule
-- changed while its occurrence finishes never deadlocks. Null when there is none.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._lock_schedule(name text)
RETURNS treadle.cron_schedules
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_job_id   bigint;
    v_queue    text;
    v_schedule treadle.cron_schedules;
BEGIN
    LOOP
        SELECT s.job_id INTO v_job_id FROM treadle.cron_schedules AS s WHERE s.name = _lock_schedule.name;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        -- the occurrence's queue first, then its lock by key (on Citus, one shard's)
        SELECT j.queue INTO v_queue FROM treadle.jobs AS j WHERE j.id = v_job_id;
        PERFORM 1 FROM treadle.jobs AS j WHERE j.id = v_job_id AND j.queue = v_queue FOR UPDATE;
        CONTINUE WHEN v_queue IS NOT NULL AND NOT FOUND;  -- its queue changed meanwhile: read it again
        SELECT s.* INTO v_schedule FROM treadle.cron_schedules AS s WHERE s.name = _lock_schedule.name FOR UPDATE;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        IF v_schedule.job_id IS NOT DISTINCT FROM v_job_id THEN
            RETURN v_schedule;
        END IF;
        -- its occurrence finished meanwhile and started the next: lock that one
    END LOOP;
    RETURN NULL;  -- not reached: the loop returns
END;
$$;
COMMENT ON FUNCTION treadle._lock_schedule(text) IS
    'Lock a schedule after its current occurrence (the order finishing uses); null when there is none.';

--------------------------------------------------------------------------------
-- treadle.schedule(name, cron, job, args, tz, queue, priority, max_attempts,
--                  catch_up) -> bigint
--
-- Transition: creates or replaces the schedule `name`, idempotently. A new
-- schedule's first occurrence, job `job` with `args` in `queue`, is inserted
-- (available, due at the next time cron names after now on the wall clock of
-- tz). The same call again changes nothing. A changed definition applies at
-- once to a waiting occurrence (its job, args, queue, priority, max_attempts,
-- and when cron or tz changed, its time: the next after now) and, for a running
-- one, to the occurrence its finish inserts. A schedule whose occurrence is gone
-- (pruned) gets a new one. Returns the current occurrence's job id.
-- Raises 22004: an argument null (args aside). 22023: name, job or queue as
-- enqueue refuses them; a bad cron expression (docs/scheduling.md) or one that
-- names no time within ten years; tz not a time zone name; args as enqueue
-- refuses them; max_attempts < 1. 42501: a tenant's queue outside its prefix,
-- or a schedule of that name in such a queue.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.schedule(
    name         text,
    cron         text,
    job          text,
    args         jsonb   DEFAULT '{}',
    tz           text    DEFAULT 'UTC',
    queue        text    DEFAULT 'default',
    priority     integer DEFAULT 0,
    max_attempts integer DEFAULT 25,
    catch_up     boolean DEFAULT false
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := treadle.now();
    v_args     jsonb;
    v_first    timestamptz;
    v_schedule treadle.cron_schedules;
    v_current  treadle.jobs;
    v_retimed  boolean;
    v_id       bigint;
BEGIN
    PERFORM treadle._check_text(schedule.name, 'name');
    PERFORM treadle._check_text(schedule.cron, 'cron');
    PERFORM treadle._check_text(schedule.job, 'job');
    PERFORM treadle._check_text(schedule.queue, 'queue');
    PERFORM treadle._check_tz(schedule.tz);
    IF schedule.priority IS NULL OR schedule.max_attempts IS NULL OR schedule.catch_up IS NULL THEN
        RAISE EXCEPTION 'treadle: % must not be null',
                        CASE WHEN schedule.priority IS NULL THEN 'priority'
                             WHEN schedule.max_attempts IS NULL THEN 'max_attempts' ELSE 'catch_up' END
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF schedule.max_attempts < 1 THEN
        RAISE EXCEPTION 'treadle: max_attempts must be at least 1, got %', schedule.max_attempts
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_args := treadle._payload(schedule.args, 'args');
    v_first := treadle._cron_next(schedule.cron, schedule.tz, v_now);
    IF v_first IS NULL THEN
        RAISE EXCEPTION 'treadle: cron "%" names no time in the next ten years', schedule.cron
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM treadle._check_queue_allowed(schedule.queue);

    v_schedule := treadle._lock_schedule(schedule.name);
    IF v_schedule.name IS NULL THEN
        INSERT INTO treadle.cron_schedules AS s
            (name, cron, tz, job, args, queue, priority, max_attempts, catch_up, next_run_at, created_at, updated_at)
        VALUES (schedule.name, schedule.cron, schedule.tz, schedule.job, v_args, schedule.queue, schedule.priority,
                schedule.max_attempts, schedule.catch_up, v_first, v_now, v_now)
        ON CONFLICT (name) DO NOTHING
        RETURNING s.* INTO v_schedule;
        IF NOT FOUND THEN
            -- created by a concurrent call that committed meanwhile: replace that one
            v_schedule := treadle._lock_schedule(schedule.name);
        END IF;
    END IF;
    PERFORM treadle._check_row_allowed(v_schedule.queue, 'schedule');
    SELECT j.* INTO v_current FROM treadle.jobs AS j WHERE j.id = v_schedule.job_id;

    IF (v_schedule.cron, v_schedule.tz, v_schedule.job, v_schedule.args, v_schedule.queue, v_schedule.priority,
        v_schedule.max_attempts, v_schedule.catch_up)
       IS DISTINCT FROM (schedule.cron, schedule.tz, schedule.job, v_args, schedule.queue, schedule.priority,
                         schedule.max_attempts, schedule.catch_up) THEN
        v_retimed := (v_schedule.cron, v_schedule.tz) IS DISTINCT FROM (schedule.cron, schedule.tz);
        UPDATE treadle.cron_schedules AS s
           SET cron = schedule.cron, tz = schedule.tz, job = schedule.job, args = v_args, queue = schedule.queue,
               priority = schedule.priority, max_attempts = schedule.max_attempts, catch_up = schedule.catch_up,
               updated_at = v_now
         WHERE s.name = schedule.name
        RETURNING s.* INTO v_schedule;
        IF v_current.state = ANY (ARRAY['available', 'retryable']) THEN
            UPDATE treadle.jobs AS j
               SET name = schedule.job, args = v_args, queue = schedule.queue, priority = schedule.priority,
                   max_attempts = schedule.max_attempts,
                   run_at = CASE WHEN v_retimed THEN v_first ELSE j.run_at END,
                   ready_txid = pg_current_xact_id()  -- moved, maybe below a claim cursor (040_claim.sql)
             WHERE j.id = v_current.id
            RETURNING j.* INTO v_current;
            IF v_retimed THEN
                UPDATE treadle.cron_schedules AS s SET next_run_at = v_first WHERE s.name = schedule.name;
            END IF;
            IF v_current.run_at <= v_now THEN
                PERFORM treadle._notify('treadle_jobs', schedule.queue);  -- due now, in its new queue
            END IF;
        END IF;
    END IF;

    IF v_current.id IS NOT NULL AND v_current.state = ANY (ARRAY['available', 'retryable', 'running']) THEN
        RETURN v_current.id;
    END IF;
    -- new, or its occurrence is gone (pruned, or finished without a successor): start one
    v_id := treadle._successor(NULL, schedule.queue, schedule.job, v_args, schedule.priority, v_first,
                               schedule.max_attempts, NULL, schedule.name);
    UPDATE treadle.cron_schedules AS s SET job_id = v_id, next_run_at = v_first WHERE s.name = schedule.name;
    RETURN v_id;
END;
$$;
COMMENT ON FUNCTION treadle.schedule(text, text, text, jsonb, text, text, integer, integer, boolean) IS
    'Create or replace a cron schedule by name (idempotent); returns its current occurrence''s job id.';

--------------------------------------------------------------------------------
-- treadle.unschedule(name) -> boolean
--
-- Transition: deletes the schedule `name`; its waiting occurrence (available or
-- retryable) -> cancelled. A running occurrence finishes as usual, and nothing
-- follows it. Returns false when there is no such schedule.
-- Raises 22004: name null. 22023: name empty, blank, over 200 characters or
-- with a control character. 42501: a tenant's schedule outside its queues.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.unschedule(name text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := treadle.now();
    v_schedule treadle.cron_schedules;
    v_job      treadle.jobs;
BEGIN
    PERFORM treadle._check_text(unschedule.name, 'name');
    v_schedule := treadle._lock_schedule(unschedule.name);
    IF v_schedule.name IS NULL THEN
        RETURN false;
    END IF;
    PERFORM treadle._check_row_allowed(v_schedule.queue, 'schedule');
    DELETE FROM treadle.cron_schedules AS s WHERE s.name = unschedule.name;
    UPDATE treadle.jobs AS j
       SET state = 'cancelled', finished_at = v_now
     WHERE j.id = v_schedule.job_id AND j.state = ANY (ARRAY['available', 'retryable'])
    RETURNING j.* INTO v_job;
    IF FOUND THEN
        PERFORM treadle._follow_up(ARRAY[v_job]);  -- tells listeners; the schedule is gone, so nothing follows
    END IF;
    RETURN true;
END;
$$;
COMMENT ON FUNCTION treadle.unschedule(text) IS
    'Delete a cron schedule and cancel its waiting occurrence; false when there is none.';

-- The schedules with the time each one's current occurrence is for, as an instant
-- and as the clocks of the schedule's zone show it. The occurrence is read in the
-- schedule's queue (on Citus the join then stays on that queue's shard: by id alone,
-- with the row-level security policies of a role that is not the owner, Citus 13.2
-- crashes the coordinator's backend); a running occurrence that set_schedule left in
-- the schedule's former queue shows no job_state until its successor.
CREATE VIEW treadle.schedules WITH (security_invoker = true) AS
SELECT s.name, s.cron, s.tz, s.job, s.queue, s.args, s.priority, s.max_attempts, s.catch_up,
       s.next_run_at,
       s.next_run_at AT TIME ZONE s.tz AS next_run_local,
       s.job_id, j.state AS job_state,
       s.created_at, s.updated_at
  FROM treadle.cron_schedules AS s
  LEFT JOIN treadle.jobs AS j ON j.id = s.job_id AND j.queue = s.queue
 ORDER BY s.name;
COMMENT ON VIEW treadle.schedules IS
    'Cron schedules: expression, time zone, job, queue, and the next run as an instant and on the zone''s clock.';
