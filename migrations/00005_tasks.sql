-- +goose Up
-- A task's money lives in four counters; available is derived and never
-- negative: budget_locked = settled + reserved + refunded + available.
CREATE TABLE tasks (
    id            BIGSERIAL PRIMARY KEY,
    code          TEXT        NOT NULL UNIQUE CHECK (code ~ '^[0-9a-f]{12}$'),
    publisher_id  BIGINT      NOT NULL REFERENCES accounts (id),
    status        TEXT        NOT NULL DEFAULT 'paused' CHECK (status IN ('paused', 'open', 'closed')),
    paused_reason TEXT,
    version       INT         NOT NULL DEFAULT 1,
    audience      TEXT        NOT NULL DEFAULT 'open' CHECK (audience IN ('open', 'restricted')),
    budget_locked BIGINT      NOT NULL CHECK (budget_locked BETWEEN 0 AND 9007199254740991),
    settled       BIGINT      NOT NULL DEFAULT 0 CHECK (settled >= 0),
    reserved      BIGINT      NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    refunded      BIGINT      NOT NULL DEFAULT 0 CHECK (refunded >= 0),
    created_at    TIMESTAMPTZ NOT NULL,
    updated_at    TIMESTAMPTZ NOT NULL,
    closed_at     TIMESTAMPTZ,
    CHECK (budget_locked - settled - reserved - refunded >= 0)
);
CREATE INDEX tasks_publisher ON tasks (publisher_id, id DESC);
CREATE INDEX tasks_board ON tasks (id DESC) WHERE status = 'open';

-- Every contract version is kept: claims and submissions are judged and
-- delivered against the version they bound, forever.
CREATE TABLE task_versions (
    task_id        BIGINT      NOT NULL REFERENCES tasks (id),
    version        INT         NOT NULL,
    contract       JSONB       NOT NULL,
    title          TEXT        NOT NULL,
    requirements   TEXT        NOT NULL,
    price          BIGINT      NOT NULL CHECK (price BETWEEN 1 AND 9007199254740991),
    receiver_url   TEXT        NOT NULL,
    output_schema  JSONB,
    harness_refs   TEXT[]      NOT NULL DEFAULT '{}',
    claim_required BOOLEAN     NOT NULL,
    claim_ttl      INT         NOT NULL,
    claim_max      INT         NOT NULL,
    max_rejected   INT         NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (task_id, version)
);
CREATE TRIGGER task_versions_immutable BEFORE UPDATE OR DELETE ON task_versions
    FOR EACH ROW EXECUTE FUNCTION refuse_change();

CREATE TABLE task_audience (
    task_id    BIGINT NOT NULL REFERENCES tasks (id),
    account_id BIGINT NOT NULL REFERENCES accounts (id),
    PRIMARY KEY (task_id, account_id)
);
CREATE INDEX task_audience_account ON task_audience (account_id);

-- An engagement. A claim-less submission creates its claim born 'used', so
-- every submission binds a version and harness revisions the same way.
CREATE TABLE claims (
    id         BIGSERIAL PRIMARY KEY,
    task_id    BIGINT      NOT NULL REFERENCES tasks (id),
    account_id BIGINT      NOT NULL REFERENCES accounts (id),
    version    INT         NOT NULL,
    amount     BIGINT      NOT NULL CHECK (amount > 0),
    status     TEXT        NOT NULL CHECK (status IN ('active', 'used', 'expired', 'released')),
    harness    JSONB       NOT NULL DEFAULT '[]',
    expires_at TIMESTAMPTZ NOT NULL,
    deadline   TIMESTAMPTZ NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    ended_at   TIMESTAMPTZ,
    FOREIGN KEY (task_id, version) REFERENCES task_versions (task_id, version)
);
CREATE UNIQUE INDEX claims_one_active ON claims (task_id, account_id) WHERE status = 'active';
CREATE INDEX claims_expiry ON claims (expires_at) WHERE status = 'active';
CREATE INDEX claims_turn ON claims (account_id, created_at, id) WHERE status = 'active';

CREATE TABLE submissions (
    id              BIGSERIAL PRIMARY KEY,
    task_id         BIGINT      NOT NULL REFERENCES tasks (id),
    account_id      BIGINT      NOT NULL REFERENCES accounts (id),
    claim_id        BIGINT      NOT NULL REFERENCES claims (id),
    version         INT         NOT NULL,
    request_key     TEXT        NOT NULL,
    -- json, not jsonb: every redelivery must send the first body byte for byte.
    payload         JSON,
    payload_hash    BYTEA       NOT NULL,
    amount          BIGINT      NOT NULL CHECK (amount > 0),
    state           TEXT        NOT NULL CHECK (state IN ('delivering', 'uncertain', 'settled', 'rejected', 'failed')),
    failure         TEXT CHECK (failure IN ('RECEIVER_UNREACHABLE', 'RECEIVER_FAULT', 'RECEIVER_PROTOCOL', 'DELIVERY_UNRESOLVED')),
    response_code   INT,
    response_body   TEXT,
    revises         BIGINT REFERENCES submissions (id),
    attempts        INT         NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMPTZ,
    uncertain_since TIMESTAMPTZ,
    created_at      TIMESTAMPTZ NOT NULL,
    terminal_at     TIMESTAMPTZ,
    UNIQUE (account_id, task_id, request_key),
    CHECK ((state IN ('delivering', 'uncertain')) = (terminal_at IS NULL)),
    CHECK ((state = 'failed') = (failure IS NOT NULL)),
    CHECK (state IN ('delivering', 'uncertain') OR payload IS NULL)
);
CREATE UNIQUE INDEX submissions_claim ON submissions (claim_id);
CREATE INDEX submissions_due ON submissions (next_attempt_at) WHERE state IN ('delivering', 'uncertain');
CREATE INDEX submissions_task ON submissions (task_id, id DESC);
CREATE INDEX submissions_agent ON submissions (account_id, id DESC);
CREATE INDEX submissions_rejections ON submissions (task_id, account_id, terminal_at) WHERE state = 'rejected';

CREATE TABLE submission_events (
    submission_id BIGINT      NOT NULL REFERENCES submissions (id),
    seq           INT         NOT NULL,
    from_state    TEXT,
    to_state      TEXT        NOT NULL,
    cause         TEXT        NOT NULL,
    at            TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (submission_id, seq)
);
CREATE TRIGGER submission_events_append_only BEFORE UPDATE OR DELETE ON submission_events
    FOR EACH ROW EXECUTE FUNCTION refuse_change();

-- Every POST to a receiver, whatever came of it.
CREATE TABLE delivery_attempts (
    id            BIGSERIAL PRIMARY KEY,
    submission_id BIGINT      NOT NULL REFERENCES submissions (id),
    attempt       INT         NOT NULL,
    started_at    TIMESTAMPTZ NOT NULL,
    status        INT,
    latency_ms    INT         NOT NULL,
    reply         TEXT,
    error         TEXT,
    outcome       TEXT        NOT NULL
);
CREATE INDEX delivery_attempts_submission ON delivery_attempts (submission_id, id);

CREATE TABLE task_reports (
    id         BIGSERIAL PRIMARY KEY,
    task_id    BIGINT      NOT NULL REFERENCES tasks (id),
    account_id BIGINT      NOT NULL REFERENCES accounts (id),
    reason     TEXT        NOT NULL,
    status     TEXT        NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'closed')),
    created_at TIMESTAMPTZ NOT NULL
);
CREATE UNIQUE INDEX task_reports_one_open ON task_reports (task_id, account_id) WHERE status = 'open';

-- +goose Down
DROP TABLE task_reports;
DROP TABLE delivery_attempts;
DROP TABLE submission_events;
DROP TABLE submissions;
DROP TABLE claims;
DROP TABLE task_audience;
DROP TABLE task_versions;
DROP TABLE tasks;
