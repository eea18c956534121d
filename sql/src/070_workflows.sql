--------------------------------------------------------------------------------
-- Workflows: a run is a set of named steps, each after the steps it depends on
-- (a graph without cycles; a plain list is the shorthand for each step after the
-- one before it). Each step is a job named 'workflow:<workflow name>/<step>'
-- whose `step` column names the step: a worker claims only the steps it has a
-- handler for, so in a rolling deploy a step no live worker runs waits (and
-- treadle.explain says so) instead of failing. A run copies the definition it
-- starts with (steps, after, sleeps, maps) and keeps it: redefining a workflow
-- changes only the runs that start after, and the run records the definition's
-- version (treadle.workflows.version, one more at each change). Completing a step stores its result on the run
-- and, in the same transaction and under the run row's lock, enqueues every
-- step whose dependencies have now all completed (treadle._advance_run), so a
-- completed step never runs again and a join is enqueued exactly once.
--------------------------------------------------------------------------------

--------------------------------------------------------------------------------
-- treadle._check_steps(steps) -> void
--
-- Raises 22004 when steps is null, 22023 when treadle._check_names refuses it,
-- it repeats a name (naming the first step repeated), or a name holds '/' (a step job is named
-- 'workflow:<workflow name>/<step>', and workflow names may hold '/': the last '/'
-- must be the one before the step, or workflow w's step a/b and workflow w/a's
-- step b would share a job name and their handlers).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_steps(steps text[])
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_slash text;
    v_twice text;
BEGIN
    PERFORM treadle._check_names(steps, 'steps');
    IF (SELECT count(DISTINCT u.s) FROM unnest(steps) AS u(s)) <> cardinality(steps) THEN
        SELECT u.s INTO v_twice FROM unnest(steps) WITH ORDINALITY AS u(s, i)
         GROUP BY u.s HAVING count(*) > 1 ORDER BY min(u.i) LIMIT 1;
        RAISE EXCEPTION 'treadle: steps must not repeat a name: step "%" is listed more than once', v_twice
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT u.s INTO v_slash FROM unnest(steps) AS u(s) WHERE strpos(u.s, '/') > 0 LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'treadle: step "%" must not hold ''/''', v_slash
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A step job is named workflow:<workflow name>/<step>; a ''/'' in a step name would make it ambiguous.';
    END IF;
END;
$$;
COMMENT ON FUNCTION treadle._check_steps(text[]) IS
    'Raise 22004/22023 for a step list that is null, empty, has empty names, repeats one or holds a ''/''.';

--------------------------------------------------------------------------------
-- treadle._check_after(steps, after) -> jsonb
--
-- The dependencies of a workflow's steps, checked against its (checked) step
-- names: null stays null (a linear list). Otherwise `after` is a JSON object
-- mapping a step to the list of steps it runs after; a step it leaves out runs
-- when the run starts. Returns the map with every step as a key (an empty list
-- for a first step), or null when it describes the linear list itself.
-- Raises 22023, naming the step: after not an object; a key that is not a step;
-- a list that is not a list of step names, names an unknown step, the step
-- itself or a step twice; over 10,000 dependencies in all or over the payload
-- size limit; a cycle.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_after(steps text[], after jsonb)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n      integer := cardinality(steps);
    v_step   text;
    v_deps   jsonb;
    v_bad    text;
    v_edges  bigint;
    v_map    jsonb;
    v_index  jsonb;
    v_from   integer[];
    v_to     integer[];
    v_indeg  integer[];
    v_start  integer[];
    v_queue  integer[];
    v_head   integer := 1;
    v_tail   integer := 0;
    v_i      integer;
    v_path   text[];
BEGIN
    IF after IS NULL THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(after) <> 'object' THEN
        RAISE EXCEPTION 'treadle: after must be a JSON object mapping a step to the steps it runs after, not %',
                        jsonb_typeof(after)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- bounded before anything walks it
    PERFORM treadle._check_payload(after, 'after', treadle._max_payload_bytes());
    SELECT coalesce(sum(CASE WHEN jsonb_typeof(e.value) = 'array' THEN jsonb_array_length(e.value) END), 0)
      INTO v_edges FROM jsonb_each(after) AS e;
    IF v_edges > 10000 THEN
        RAISE EXCEPTION 'treadle: after must hold at most 10000 dependencies in all, got %', v_edges
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT jsonb_object_agg(u.s, u.i) INTO v_index FROM unnest(steps) WITH ORDINALITY AS u(s, i);

    FOR v_step, v_deps IN SELECT e.key, e.value FROM jsonb_each(after) AS e LOOP
        IF NOT v_index ? v_step THEN
            RAISE EXCEPTION 'treadle: after names step "%", which is not one of the steps', v_step
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF jsonb_typeof(v_deps) <> 'array'
           OR EXISTS (SELECT 1 FROM jsonb_array_elements(v_deps) AS d(v) WHERE jsonb_typeof(d.v) <> 'string') THEN
            RAISE EXCEPTION 'treadle: step "%": after must list step names (a JSON array of strings)', v_step
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT d.v INTO v_bad FROM jsonb_array_elements_text(v_deps) AS d(v) WHERE NOT v_index ? d.v LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'treadle: step "%" runs after "%", which is not one of the steps', v_step, v_bad
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF v_deps ? v_step THEN
            RAISE EXCEPTION 'treadle: step "%" runs after itself (a dependency cycle)', v_step
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT d.v INTO v_bad FROM jsonb_array_elements_text(v_deps) AS d(v) GROUP BY d.v HAVING count(*) > 1 LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'treadle: step "%" names "%" twice in after', v_step, v_bad
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;

    SELECT jsonb_object_agg(u.s, coalesce(after -> u.s, '[]'::jsonb)) INTO v_map FROM unnest(steps) AS u(s);

    -- Cycles: Kahn's algorithm over the step positions, O(steps + dependencies).
    -- The edges dependency -> step, sorted by dependency; v_start[i] is where the
    -- edges leaving step i begin.
    SELECT coalesce(array_agg(e.f ORDER BY e.f, e.t), '{}'), coalesce(array_agg(e.t ORDER BY e.f, e.t), '{}')
      INTO v_from, v_to
      FROM (SELECT (v_index ->> d.v)::integer AS f, (v_index ->> kv.key)::integer AS t
              FROM jsonb_each(after) AS kv
             CROSS JOIN LATERAL jsonb_array_elements_text(kv.value) AS d(v)) AS e;
    v_indeg := array_fill(0, ARRAY[v_n]);
    v_start := array_fill(0, ARRAY[v_n + 1]);
    FOR v_i IN 1 .. cardinality(v_from) LOOP
        v_indeg[v_to[v_i]] := v_indeg[v_to[v_i]] + 1;
        v_start[v_from[v_i] + 1] := v_start[v_from[v_i] + 1] + 1;
    END LOOP;
    v_start[1] := 1;
    FOR v_i IN 1 .. v_n LOOP
        v_start[v_i + 1] := v_start[v_i] + v_start[v_i + 1];
    END LOOP;
    v_queue := array_fill(0, ARRAY[v_n]);
    FOR v_i IN 1 .. v_n LOOP
        IF v_indeg[v_i] = 0 THEN
            v_tail := v_tail + 1;
            v_queue[v_tail] := v_i;
        END IF;
    END LOOP;
    WHILE v_head <= v_tail LOOP
        v_i := v_queue[v_head];
        v_head := v_head + 1;
        FOR v_t IN v_start[v_i] .. v_start[v_i + 1] - 1 LOOP
            v_indeg[v_to[v_t]] := v_indeg[v_to[v_t]] - 1;
            IF v_indeg[v_to[v_t]] = 0 THEN
                v_tail := v_tail + 1;
                v_queue[v_tail] := v_to[v_t];
            END IF;
        END LOOP;
    END LOOP;
    IF v_tail < v_n THEN
        -- Every step left over waits on another one left over: walk back along
        -- those dependencies until a step comes round again; that is the cycle.
        SELECT u.s INTO v_step FROM unnest(steps) WITH ORDINALITY AS u(s, i) WHERE v_indeg[u.i] > 0 ORDER BY u.i LIMIT 1;
        v_path := ARRAY[v_step];
        LOOP
            SELECT d.v INTO v_step
              FROM jsonb_array_elements_text(v_map -> v_step) AS d(v)
             WHERE v_indeg[(v_index ->> d.v)::integer] > 0
             LIMIT 1;
            EXIT WHEN v_step = ANY (v_path);
            v_path := v_path || v_step;
        END LOOP;
        v_path := v_path[array_position(v_path, v_step):] || v_step;
        RAISE EXCEPTION 'treadle: step "%" is in a dependency cycle: %', v_step, array_to_string(v_path, ' after ')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- the linear list itself: each step after exactly the one before it
    IF NOT EXISTS (SELECT 1 FROM unnest(steps) WITH ORDINALITY AS u(s, i)
                    WHERE v_map -> u.s <> CASE WHEN u.i = 1 THEN '[]'::jsonb ELSE jsonb_build_array(steps[u.i - 1]) END) THEN
        RETURN NULL;
    END IF;
    RETURN v_map;
END;
$$;
COMMENT ON FUNCTION treadle._check_after(text[], jsonb) IS
    'Check the dependencies of workflow steps (22023 naming the step: unknown, repeated, a cycle); null for a linear list.';

--------------------------------------------------------------------------------
-- treadle._check_sleeps(steps, sleeps) -> jsonb
--
-- The sleep steps of a workflow: null or {} is none (null). Otherwise a JSON
-- object mapping a step to how long it waits, an interval as text ('1 hour'), or
-- to {"until": time}: a timestamptz as text ('2027-01-04 09:00+01'), or
-- {"input": key}, the run's input holding that time under the key
-- (treadle._sleep_wake reads it when the step becomes ready). A sleep step has
-- no handler: it completes by itself that long after it becomes ready, or at
-- that time (treadle.rescue ends it; a time already past ends it at once).
-- Returns the map with each interval and time normalised.
-- Raises 22023, naming the step: sleeps not an object; a key that is not a step;
-- a value that is neither an interval nor {"until": ...}; an interval not
-- positive or over 366 days; a time that is not a timestamptz, is not finite or
-- is over 366 days after treadle.now(); an input key that is not a valid name;
-- sleeps over the payload size limit.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_sleeps(steps text[], sleeps jsonb)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_step  text;
    v_value jsonb;
    v_for   interval;
    v_until jsonb;
    v_map   jsonb := '{}'::jsonb;
BEGIN
    IF sleeps IS NULL OR sleeps = '{}'::jsonb THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(sleeps) <> 'object' THEN
        RAISE EXCEPTION 'treadle: sleeps must be a JSON object mapping a step to an interval, not %', jsonb_typeof(sleeps)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM treadle._check_payload(sleeps, 'sleeps', treadle._max_payload_bytes());
    FOR v_step, v_value IN SELECT e.key, e.value FROM jsonb_each(sleeps) AS e LOOP
        IF NOT v_step = ANY (steps) THEN
            RAISE EXCEPTION 'treadle: sleeps names step "%", which is not one of the steps', v_step
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF jsonb_typeof(v_value) = 'object' THEN
            IF (SELECT count(*) FROM jsonb_object_keys(v_value)) <> 1 OR NOT v_value ? 'until' THEN
                RAISE EXCEPTION 'treadle: sleep step "%" waits an interval such as "1 hour" or {"until": time}, not %',
                                v_step, v_value
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            v_until := v_value -> 'until';
            IF jsonb_typeof(v_until) = 'object' THEN
                IF (SELECT count(*) FROM jsonb_object_keys(v_until)) <> 1
                   OR jsonb_typeof(v_until -> 'input') IS DISTINCT FROM 'string'
                   OR NOT coalesce(treadle._is_name(v_until ->> 'input'), false) THEN
                    RAISE EXCEPTION 'treadle: sleep step "%" sleeps until a time or {"input": key}, not %', v_step, v_until
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
            ELSE
                v_until := to_jsonb(to_char(treadle._sleep_until(v_step, v_until, 'a time', treadle.now())
                                            AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'));
            END IF;
            v_map := v_map || jsonb_build_object(v_step, jsonb_build_object('until', v_until));
            CONTINUE;
        END IF;
        v_for := NULL;
        IF jsonb_typeof(v_value) = 'string' THEN
            BEGIN
                v_for := (v_value #>> '{}')::interval;
            EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
                v_for := NULL;
            END;
        END IF;
        IF v_for IS NULL THEN
            RAISE EXCEPTION 'treadle: sleep step "%" must wait an interval such as "1 hour", not %', v_step, v_value
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF v_for <= interval '0' OR v_for > interval '366 days' THEN
            RAISE EXCEPTION 'treadle: sleep step "%" must wait more than 0 and at most 366 days, got %', v_step, v_for
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_map := v_map || jsonb_build_object(v_step, v_for::text);
    END LOOP;
    RETURN v_map;
END;
$$;
COMMENT ON FUNCTION treadle._check_sleeps(text[], jsonb) IS
    'Check the sleep steps of a workflow (22023 naming the step); null for none.';

--------------------------------------------------------------------------------
-- treadle._check_maps(steps, after, sleeps, maps) -> jsonb
--
-- The map steps of a workflow, checked against its step names, its (checked)
-- graph `after` and its sleep steps: null or {} is none (null). Otherwise a JSON
-- object mapping a step to what it maps over: the name of a step it runs after
-- directly, whose result is then the array, or {"input": key}, the run's input
-- holding the array under that key. The map step becomes one job per element of
-- the array, and completes with their results in element order once all
-- completed (treadle._enqueue_map).
-- Raises 22023, naming the step: maps not an object; a key that is not a step or
-- is a sleep step; a value that is neither a step the key runs after directly nor
-- {"input": key} with a valid key; maps over the payload size limit.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._check_maps(steps text[], after jsonb, sleeps jsonb, maps jsonb)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_step  text;
    v_value jsonb;
BEGIN
    IF maps IS NULL OR maps = '{}'::jsonb THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(maps) <> 'object' THEN
        RAISE EXCEPTION 'treadle: maps must be a JSON object mapping a step to the step whose result it maps over, not %',
                        jsonb_typeof(maps)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM treadle._check_payload(maps, 'maps', treadle._max_payload_bytes());
    FOR v_step, v_value IN SELECT e.key, e.value FROM jsonb_each(maps) AS e LOOP
        IF NOT v_step = ANY (steps) THEN
            RAISE EXCEPTION 'treadle: maps names step "%", which is not one of the steps', v_step
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF sleeps IS NOT NULL AND sleeps ? v_step THEN
            RAISE EXCEPTION 'treadle: step "%" is a sleep step and cannot map', v_step
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF jsonb_typeof(v_value) = 'object' THEN
            IF (SELECT count(*) FROM jsonb_object_keys(v_value)) <> 1 OR jsonb_typeof(v_value -> 'input') IS DISTINCT FROM 'string'
               OR NOT coalesce(treadle._is_name(v_value ->> 'input'), false) THEN
                RAISE EXCEPTION 'treadle: map step "%" maps over a step name or {"input": key}, not %', v_step, v_value
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            CONTINUE;
        END IF;
        IF jsonb_typeof(v_value) <> 'string' THEN
            RAISE EXCEPTION 'treadle: map step "%" maps over a step name or {"input": key}, not %', v_step, v_value
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF NOT (after -> v_step) ? (v_value #>> '{}') THEN
            RAISE EXCEPTION 'treadle: map step "%" maps over step "%", which it does not run after', v_step, v_value #>> '{}'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    RETURN maps;
END;
$$;
COMMENT ON FUNCTION treadle._check_maps(text[], jsonb, jsonb, jsonb) IS
    'Check the map steps of a workflow (22023 naming the step); null for none.';

--------------------------------------------------------------------------------
-- treadle._linear_after(steps) -> jsonb
--
-- The graph of a list, spelled out: each step after the one before it.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._linear_after(steps text[])
RETURNS jsonb
LANGUAGE sql
IMMUTABLE
BEGIN ATOMIC
    SELECT jsonb_object_agg(u.s, CASE WHEN u.i = 1 THEN '[]'::jsonb ELSE jsonb_build_array(steps[u.i - 1]) END)
      FROM unnest(steps) WITH ORDINALITY AS u(s, i);
END;
COMMENT ON FUNCTION treadle._linear_after(text[]) IS
    'The dependencies of a list of steps spelled out as a graph: each step after the one before it.';

--------------------------------------------------------------------------------
-- treadle.define_workflow(name, steps, after, sleeps, maps, waits, children, compensations,
--                         step_options) -> void
--
-- Records the step names of a workflow and, in `after`, the steps each one runs
-- after (a JSON object: step -> [steps]; a step it leaves out starts with the
-- run). Without `after`, each step runs after the one before it. `sleeps` names
-- the sleep steps and how long each waits (treadle._check_sleeps); `maps` the map
-- steps and what each maps over (treadle._check_maps); `waits` the wait steps and
-- the signal each waits for (treadle._check_waits); `children` the child steps
-- and the workflow each starts (treadle._check_children); `compensations` the
-- compensating step of each step that has one (treadle._check_compensations);
-- `step_options` each step's own queue, priority, max_attempts, timeout and
-- backoff (treadle._check_step_options). Workers call it
-- when they register a workflow. Replaces an earlier definition for new runs,
-- and then counts one more version (the same definition again changes nothing);
-- existing runs keep the steps they started with.
-- Raises 22004: name or steps null. 22023: a name that is not a valid name (see
-- treadle._is_name); steps empty, nested, over 1000, with a bad name, or
-- repeating one; after as treadle._check_after refuses it (an unknown or
-- repeated dependency, a cycle: the message names the step); sleeps as
-- treadle._check_sleeps refuses it; maps as treadle._check_maps refuses it; waits
-- as treadle._check_waits refuses it; children as treadle._check_children refuses
-- it; compensations as treadle._check_compensations refuses it; step_options as
-- treadle._check_step_options refuses it. 42501: a tenant's
-- workflow name (or a child step's workflow or queue, or a step's queue) outside its
-- prefix (a tenant's definitions are named under its queue prefix, so no tenant
-- replaces another's).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.define_workflow(name text, steps text[], after jsonb DEFAULT NULL,
                                                   sleeps jsonb DEFAULT NULL, maps jsonb DEFAULT NULL,
                                                   waits jsonb DEFAULT NULL, children jsonb DEFAULT NULL,
                                                   compensations jsonb DEFAULT NULL,
                                                   step_options jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_after  jsonb;
    v_sleeps jsonb;
    v_maps   jsonb;
    v_waits  jsonb;
    v_children jsonb;
    v_compensations jsonb;
    v_step_options jsonb;
BEGIN
    PERFORM treadle._check_text(define_workflow.name, 'name');
    PERFORM treadle._check_workflow_allowed(define_workflow.name);
    PERFORM treadle._check_steps(define_workflow.steps);
    v_after := treadle._check_after(define_workflow.steps, define_workflow.after);
    v_sleeps := treadle._check_sleeps(define_workflow.steps, define_workflow.sleeps);
    v_maps := treadle._check_maps(define_workflow.steps,
                                  coalesce(v_after, treadle._linear_after(define_workflow.steps)),
                                  v_sleeps, define_workflow.maps);
    v_waits := treadle._check_waits(define_workflow.steps, v_sleeps, v_maps, define_workflow.waits);
    v_children := treadle._check_children(define_workflow.steps, v_sleeps, v_maps, define_workflow.children, v_waits);
    v_compensations := treadle._check_compensations(define_workflow.steps, v_sleeps, v_maps, v_children,
                                                    define_workflow.compensations, v_waits);
    v_step_options := treadle._check_step_options(define_workflow.steps, v_sleeps, v_waits, v_children,
                                                  v_compensations, define_workflow.step_options);
    IF v_sleeps IS NOT NULL OR v_maps IS NOT NULL OR v_waits IS NOT NULL OR v_children IS NOT NULL THEN
        v_after := coalesce(v_after, treadle._linear_after(define_workflow.steps));
    END IF;

    INSERT INTO treadle.workflows AS w (name, steps, updated_at, after, sleeps, maps, waits, children, compensations,
                                        step_options)
    VALUES (define_workflow.name, define_workflow.steps, treadle.now(), v_after, v_sleeps, v_maps, v_waits, v_children,
            v_compensations, v_step_options)
    ON CONFLICT (name) DO UPDATE
       SET steps = excluded.steps, updated_at = excluded.updated_at, after = excluded.after, sleeps = excluded.sleeps,
           maps = excluded.maps, waits = excluded.waits, children = excluded.children,
           compensations = excluded.compensations, step_options = excluded.step_options, version = w.version + 1
     WHERE w.steps IS DISTINCT FROM excluded.steps OR w.after IS DISTINCT FROM excluded.after
        OR w.sleeps IS DISTINCT FROM excluded.sleeps OR w.maps IS DISTINCT FROM excluded.maps
        OR w.waits IS DISTINCT FROM excluded.waits
        OR w.children IS DISTINCT FROM excluded.children OR w.compensations IS DISTINCT FROM excluded.compensations
        OR w.step_options IS DISTINCT FROM excluded.step_options;
END;
$$;
COMMENT ON FUNCTION treadle.define_workflow(text, text[], jsonb, jsonb, jsonb, jsonb, jsonb, jsonb, jsonb) IS
    'Record (or replace) the steps of a workflow and the steps each one runs after.';

--------------------------------------------------------------------------------
-- treadle.start_workflow(name, input, steps, queue, priority, max_attempts,
--                        idempotency_key, after, sleeps, maps, waits, children, compensations,
--                        step_options, meta) -> bigint
--
-- Transition: (none) -> a running run, and the job of each step it starts with
-- (the first step of a list, every step without dependencies of a graph) ->
-- available, in the caller's transaction. The run records its steps and their
-- dependencies: `steps`, `after`, `sleeps`, `maps`, `waits`, `children`, `compensations` and
-- `step_options` (each step job's own queue, priority, max_attempts, timeout, backoff; the run's otherwise) (as
-- define_workflow takes them; a child step ready at the start starts its child run at once), or when
-- steps is null the definition from treadle.define_workflow, and then its version.
-- `meta` is the run's metadata (a JSON object, e.g. trace context; SQL or JSON
-- null: none), bounded as enqueue's; every step job of the run (and of its child
-- runs, which inherit it) carries it in its own meta.
-- Returns the run id; a
-- workflow idempotency key (a namespace apart from jobs') that a run already
-- holds returns that run's id and starts nothing.
-- Raises 22004: name or queue null. 22023: name, queue or key not a valid name;
-- input neither an object nor an array, over the size limit or nested over 100
-- levels; meta as treadle._check_meta refuses it; max_attempts < 1; steps, after, sleeps, maps, waits, children, compensations or step_options as
-- define_workflow refuses them; after, sleeps, maps, waits, children, compensations or step_options without
-- steps; no steps given and no definition (unknown workflow); a child step ready at the start
-- that treadle._start_child refuses. 42501: a tenant's queue or workflow name (or a
-- child step's, or a step's queue, the definition's too) outside its prefix.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.start_workflow(
    name            text,
    input           jsonb   DEFAULT '{}',
    steps           text[]  DEFAULT NULL,
    queue           text    DEFAULT 'default',
    priority        integer DEFAULT 0,
    max_attempts    integer DEFAULT 25,
    idempotency_key text    DEFAULT NULL,
    after           jsonb   DEFAULT NULL,
    sleeps          jsonb   DEFAULT NULL,
    maps            jsonb   DEFAULT NULL,
    waits           jsonb   DEFAULT NULL,
    children        jsonb   DEFAULT NULL,
    compensations   jsonb   DEFAULT NULL,
    step_options    jsonb   DEFAULT NULL,
    meta            jsonb   DEFAULT NULL
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := treadle.now();
    v_input jsonb;
    v_steps text[] := start_workflow.steps;
    v_after jsonb;
    v_sleeps jsonb;
    v_maps  jsonb;
    v_waits jsonb;
    v_version bigint;
    v_children jsonb;
    v_compensations jsonb;
    v_step_options jsonb;
    v_meta  jsonb;
    v_run   treadle.workflow_runs;
    v_id    bigint;
BEGIN
    -- The common call (a list of steps given, or a definition that is one; no key, meta
    -- or other option; a small input): its checks in one expression, and no tenant
    -- (treadle.enqueue_guards' row '', 066_enqueue_guards.sql) read by the insert
    -- itself, as enqueue's common call does; a tenant's call, or anything else, goes
    -- the whole way below, which raises what it raises. A definition's steps were
    -- checked by define_workflow. (Not on Citus, where the insert below is routed.)
    IF NOT treadle._on_citus()
       AND start_workflow.idempotency_key IS NULL AND start_workflow.meta IS NULL
       AND start_workflow.after IS NULL AND start_workflow.sleeps IS NULL AND start_workflow.maps IS NULL
       AND start_workflow.waits IS NULL AND start_workflow.children IS NULL
       AND start_workflow.compensations IS NULL AND start_workflow.step_options IS NULL
       AND start_workflow.priority IS NOT NULL AND start_workflow.max_attempts >= 1
       AND treadle._is_name(start_workflow.name) AND treadle._is_name(start_workflow.queue)
       AND jsonb_typeof(start_workflow.input) = ANY (ARRAY['object', 'array'])
       AND pg_column_size(start_workflow.input) < 800 AND pg_column_compression(start_workflow.input) IS NULL
       -- (treadle._check_steps's tests: names, none holding '/', each once: that one by the insert)
       AND (v_steps IS NULL OR (treadle._are_names(v_steps) AND strpos(array_to_string(v_steps, ''), '/') = 0)) THEN
        IF v_steps IS NULL THEN
            INSERT INTO treadle.workflow_runs AS r (name, input, steps, queue, priority, max_attempts, created_at, version)
            SELECT start_workflow.name, start_workflow.input, w.steps, start_workflow.queue, start_workflow.priority,
                   start_workflow.max_attempts, v_now, w.version
              FROM treadle.workflows AS w
             WHERE w.name = start_workflow.name
               AND w.after IS NULL AND w.sleeps IS NULL AND w.maps IS NULL AND w.waits IS NULL
               AND w.children IS NULL AND w.compensations IS NULL AND w.step_options IS NULL
               AND NOT EXISTS (SELECT 1 FROM treadle.enqueue_guards AS g WHERE g.queue = '')
            RETURNING r.* INTO v_run;
        ELSE
            INSERT INTO treadle.workflow_runs AS r (name, input, steps, queue, priority, max_attempts, created_at)
            SELECT start_workflow.name, start_workflow.input, v_steps, start_workflow.queue, start_workflow.priority,
                   start_workflow.max_attempts, v_now
             WHERE NOT EXISTS (SELECT 1 FROM treadle.enqueue_guards AS g WHERE g.queue = '')
               AND (SELECT count(DISTINCT u.s) FROM unnest(v_steps) AS u(s)) = cardinality(v_steps)
            RETURNING r.* INTO v_run;
        END IF;
        IF v_run.id IS NOT NULL THEN
            PERFORM treadle._enqueue_steps(v_run, ARRAY[v_run.steps[1]], v_now);
            RETURN v_run.id;
        END IF;
    END IF;

    v_meta := treadle._check_meta(start_workflow.meta);  -- 081_step_keys.sql
    PERFORM treadle._check_text(start_workflow.name, 'name');
    PERFORM treadle._check_workflow_allowed(start_workflow.name);
    PERFORM treadle._check_text(start_workflow.queue, 'queue');
    IF start_workflow.idempotency_key IS NOT NULL THEN
        PERFORM treadle._check_text(start_workflow.idempotency_key, 'idempotency_key');
    END IF;
    -- the checks of treadle._payload, its limit read only when the input could pass it
    -- (the limit is never under 1 KiB), as enqueue does
    v_input := start_workflow.input;
    IF v_input IS NULL OR jsonb_typeof(v_input) <> ALL (ARRAY['object', 'array'])
       OR (pg_column_size(v_input) > 1024 AND pg_column_size(v_input) > treadle._max_payload_bytes())
       OR treadle._too_deep(v_input) THEN
        v_input := treadle._payload(v_input, 'input');  -- {} for null; 22023 for the rest
    END IF;
    IF start_workflow.priority IS NULL THEN
        RAISE EXCEPTION 'treadle: priority must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF start_workflow.max_attempts IS NULL OR start_workflow.max_attempts < 1 THEN
        RAISE EXCEPTION 'treadle: max_attempts must be at least 1, got %',
                        coalesce(start_workflow.max_attempts::text, 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_steps IS NULL THEN
        IF start_workflow.after IS NOT NULL OR start_workflow.sleeps IS NOT NULL OR start_workflow.maps IS NOT NULL
           OR start_workflow.children IS NOT NULL OR start_workflow.compensations IS NOT NULL THEN
            RAISE EXCEPTION 'treadle: after, sleeps, maps, children and compensations need steps'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF start_workflow.step_options IS NOT NULL THEN
            RAISE EXCEPTION 'treadle: step_options need steps' USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF start_workflow.waits IS NOT NULL THEN
            RAISE EXCEPTION 'treadle: waits need steps' USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT w.steps, w.after, w.sleeps, w.maps, w.waits, w.version, w.children, w.compensations, w.step_options
          INTO v_steps, v_after, v_sleeps, v_maps, v_waits, v_version, v_children, v_compensations, v_step_options
          FROM treadle.workflows AS w WHERE w.name = start_workflow.name;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'treadle: unknown workflow %', start_workflow.name
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass steps, or register the workflow with a worker (treadle.define_workflow).';
        END IF;
        IF v_children IS NOT NULL THEN
            -- the caller's own prefix, whoever defined the workflow
            PERFORM treadle._check_children(v_steps, v_sleeps, v_maps, v_children, v_waits);
        END IF;
        IF v_step_options IS NOT NULL THEN
            PERFORM treadle._check_step_queues(v_step_options);  -- the caller's prefix, as for children
        END IF;
    ELSIF start_workflow.after IS NULL AND start_workflow.sleeps IS NULL AND start_workflow.maps IS NULL
          AND start_workflow.waits IS NULL AND start_workflow.children IS NULL
          AND start_workflow.compensations IS NULL AND start_workflow.step_options IS NULL THEN
        PERFORM treadle._check_steps(v_steps);  -- a list of steps and nothing more: no other check has work
    ELSE
        PERFORM treadle._check_steps(v_steps);
        v_after := treadle._check_after(v_steps, start_workflow.after);
        v_sleeps := treadle._check_sleeps(v_steps, start_workflow.sleeps);
        v_maps := treadle._check_maps(v_steps, coalesce(v_after, treadle._linear_after(v_steps)),
                                      v_sleeps, start_workflow.maps);
        v_waits := treadle._check_waits(v_steps, v_sleeps, v_maps, start_workflow.waits);
        v_children := treadle._check_children(v_steps, v_sleeps, v_maps, start_workflow.children, v_waits);
        v_compensations := treadle._check_compensations(v_steps, v_sleeps, v_maps, v_children,
                                                        start_workflow.compensations, v_waits);
        v_step_options := treadle._check_step_options(v_steps, v_sleeps, v_waits, v_children, v_compensations,
                                                      start_workflow.step_options);
        IF v_sleeps IS NOT NULL OR v_maps IS NOT NULL OR v_waits IS NOT NULL OR v_children IS NOT NULL THEN
            v_after := coalesce(v_after, treadle._linear_after(v_steps));
        END IF;
    END IF;
    PERFORM treadle._check_queue_allowed(start_workflow.queue);

    LOOP
        INSERT INTO treadle.workflow_runs AS r
            (name, input, steps, queue, priority, max_attempts, idempotency_key, created_at, after, sleeps, maps,
             waits, version, children, compensations, step_options, meta)
        VALUES
            (start_workflow.name, v_input, v_steps, start_workflow.queue, start_workflow.priority,
             start_workflow.max_attempts, start_workflow.idempotency_key, v_now, v_after, v_sleeps, v_maps,
             v_waits, v_version, v_children, v_compensations, v_step_options, v_meta)
        ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING r.* INTO v_run;

        IF v_run.id IS NOT NULL THEN
            IF v_after IS NULL THEN
                PERFORM treadle._enqueue_steps(v_run, ARRAY[v_steps[1]], v_now);
            ELSE
                PERFORM treadle._enqueue_ready(v_run, v_now);
            END IF;
            RETURN v_run.id;
        END IF;

        SELECT r.id INTO v_id FROM treadle.workflow_runs AS r
         WHERE r.queue = start_workflow.queue AND r.idempotency_key = start_workflow.idempotency_key;
        IF FOUND THEN
            RETURN v_id;
        END IF;
    END LOOP;
END;
$$;
COMMENT ON FUNCTION treadle.start_workflow(text, jsonb, text[], text, integer, integer, text, jsonb, jsonb, jsonb, jsonb, jsonb, jsonb, jsonb, jsonb) IS
    'Start a workflow run and enqueue the steps it starts with; returns the run id.';

--------------------------------------------------------------------------------
-- treadle.cancel_workflow(run_id) -> boolean
--
-- Transition: a running run's pending steps are cancelled (the run becomes
-- cancelled at once), and its running steps get a cancel request (the run
-- becomes cancelled when the first of them finishes, if no pending step was
-- cancelled); a run with no step job pending (only sleeps under way) becomes
-- cancelled at once. Its sleeps under way stop waking it (wake_at null) and its
-- signal waits under way end (waiting, wait_until null: a signal is then kept, and a
-- retried run waits again), so no step starts after the cancel. Its child runs
-- under way are cancelled the same way (a child that becomes cancelled cancels the
-- run with it). Returns false for an unknown run, one that is not running, or one
-- whose steps and children all have their cancel requested already. Locks the
-- step jobs under way of its run tree (from its topmost parent run down, the
-- running runs) first, in (queue, concurrency_key, id) order, then the tree's runs,
-- a child before its parent (treadle._lock_run_tree_jobs,
-- 053_workflow_lock_order.sql), so that it never holds a run row while it waits for
-- a step job that a worker's finish holds, nor a parent while it waits for a child
-- run that a re-check, a sleep's end or a signal moves, and it reads the run's steps
-- after a step another session enqueued committed.
-- Raises 22004: run_id null. 42501: a tenant's run outside its queues. 40001: the
-- run tree changed 100 times while its jobs were being locked (treadle._lock_run_tree_jobs):
-- nothing is cancelled, the caller retries.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.cancel_workflow(run_id bigint)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := treadle.now();
    v_queue  text;  -- the run's: read first, then every statement on the run names it
    v_run    treadle.workflow_runs;  -- the run as its cancel left it
BEGIN
    IF cancel_workflow.run_id IS NULL THEN
        RAISE EXCEPTION 'treadle: run_id must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT r.queue INTO v_queue FROM treadle.workflow_runs AS r WHERE r.id = cancel_workflow.run_id;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM treadle._check_row_allowed(v_queue, 'workflow run');

    PERFORM 1 FROM treadle.workflow_runs AS r
     WHERE r.queue = v_queue AND r.id = cancel_workflow.run_id AND r.state = 'running';
    IF NOT FOUND THEN
        RETURN false;
    END IF;

    -- the step jobs under way of the run's tree first, before any run row
    -- (053_workflow_lock_order.sql: the order a batch's finish keeps too)
    PERFORM treadle._lock_run_tree_jobs(ARRAY[cancel_workflow.run_id]);
    -- its steps and child runs (070_workflow_cancel.sql: a step's own end that cancels
    -- the run stops them there too)
    IF treadle._cancel_under_way(cancel_workflow.run_id, v_queue) THEN
        RETURN true;
    END IF;

    PERFORM 1 FROM treadle.jobs AS j
     WHERE j.workflow_run_id = cancel_workflow.run_id
       AND j.state = ANY (ARRAY['available', 'retryable', 'running', 'blocked'])
    UNION ALL
    SELECT 1 FROM treadle.workflow_runs AS r
     WHERE r.parent_run_id = cancel_workflow.run_id AND r.state = 'running';
    IF FOUND THEN
        RETURN false;  -- its cancel is requested already
    END IF;
    -- a running run without a pending step job (only sleeps under way, or its step
    -- rows were deleted by hand)
    UPDATE treadle.workflow_runs AS r
       SET state = 'cancelled', finished_at = v_now
     WHERE r.queue = v_queue AND r.id = cancel_workflow.run_id AND r.state = 'running'
    RETURNING r.* INTO v_run;
    PERFORM treadle._child_run_ended(v_run);  -- 076_workflow_children.sql
    RETURN v_run.id IS NOT NULL;
END;
$$;
COMMENT ON FUNCTION treadle.cancel_workflow(bigint) IS
    'Cancel a running workflow run (its pending steps now, its running steps when they finish).';

--------------------------------------------------------------------------------
-- treadle.workflow_results(run_id) -> jsonb
--
-- The finished steps' results keyed by step name: {} before any step finished,
-- null for an unknown run (or one the caller may not see: it runs with the
-- caller's rights, so row-level security applies). PL/pgSQL, not SQL: Citus
-- plans no SQL-language function that reads a distributed table by a parameter.
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.workflow_results(run_id bigint)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_results jsonb;
BEGIN
    SELECT r.results INTO v_results FROM treadle.workflow_runs AS r WHERE r.id = workflow_results.run_id;
    RETURN v_results;
END;
$$;
COMMENT ON FUNCTION treadle.workflow_results(bigint) IS
    'A workflow run''s step results keyed by step name; null for an unknown run.';

--------------------------------------------------------------------------------
-- treadle._step_results(steps, after, results, step) -> jsonb
--
-- What step `step` of a run receives, from the run's steps, dependencies (after)
-- and results: the results of the steps it runs after, directly or through
-- others, keyed by step name (for a linear list, every step before it). {} for a
-- step without dependencies or a step that is not the run's. Reads no table: the
-- worker calls it on the runs it reads for its claimed steps (each run read once).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle._step_results(steps text[], after jsonb, results jsonb, step text)
RETURNS jsonb
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_other jsonb;
    v_after jsonb;
    v_todo  text[];
    v_seen  jsonb;
BEGIN
    IF _step_results.after IS NULL THEN
        -- a list: the steps before it. Most often the run holds no other result, and
        -- the results go as they are, without a statement
        v_other := _step_results.results
                   - _step_results.steps[1 : coalesce(array_position(_step_results.steps, _step_results.step), 1) - 1];
        IF v_other = '{}'::jsonb THEN
            RETURN _step_results.results;
        END IF;
        RETURN _step_results.results - ARRAY(SELECT jsonb_object_keys(v_other));
    END IF;
    -- a graph: walk back along the dependencies, a layer at a time (the map
    -- decompressed once, here: each lookup below would do it again)
    v_after := '{}'::jsonb || _step_results.after;
    v_seen := '{}'::jsonb;
    v_todo := ARRAY(SELECT d.v FROM jsonb_array_elements_text(v_after -> _step_results.step) AS d(v));
    WHILE cardinality(v_todo) > 0 LOOP
        v_seen := v_seen || (SELECT jsonb_object_agg(t.s, true) FROM unnest(v_todo) AS t(s));
        v_todo := ARRAY(SELECT DISTINCT d.v
                          FROM unnest(v_todo) AS t(s)
                         CROSS JOIN LATERAL jsonb_array_elements_text(v_after -> t.s) AS d(v)
                         WHERE NOT v_seen ? d.v);
    END LOOP;
    RETURN coalesce((SELECT jsonb_object_agg(e.key, e.value) FROM jsonb_each(_step_results.results) AS e
                      WHERE v_seen ? e.key), '{}'::jsonb);
END;
$$;
COMMENT ON FUNCTION treadle._step_results(text[], jsonb, jsonb, text) IS
    'The results a workflow step receives, from its run''s steps, dependencies and results.';

--------------------------------------------------------------------------------
-- treadle.workflow_step_results(run_id, step) -> jsonb
--
-- What a step receives (treadle._step_results): the results of the steps it runs
-- after, directly or through others, keyed by step name (for a linear list, every
-- step before it). {} for a step without dependencies or a step that is not the
-- run's; null for an unknown run (or one the caller may not see: it runs with the
-- caller's rights).
--------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION treadle.workflow_step_results(run_id bigint, step text)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_steps   text[];
    v_after   jsonb;
    v_results jsonb;
BEGIN
    SELECT r.steps, r.after, r.results INTO v_steps, v_after, v_results
      FROM treadle.workflow_runs AS r WHERE r.id = workflow_step_results.run_id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN treadle._step_results(v_steps, v_after, v_results, workflow_step_results.step);
END;
$$;
COMMENT ON FUNCTION treadle.workflow_step_results(bigint, text) IS
    'The results a workflow step receives: those of the steps it runs after, directly or not; null for an unknown run.';
