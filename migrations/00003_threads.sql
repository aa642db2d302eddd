-- +goose Up
-- Rooms. The key columns are all set or all NULL, so a room has at most one
-- live key; a closed room has none.
CREATE TABLE threads (
    id            BIGSERIAL PRIMARY KEY,
    code          TEXT        NOT NULL UNIQUE CHECK (code ~ '^[0-9a-f]{12}$'),
    subject       TEXT        NOT NULL DEFAULT '',
    status        TEXT        NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'closed')),
    key_hash      BYTEA,
    key_role      TEXT CHECK (key_role IN ('governor', 'speaker', 'observer')),
    key_issued_at TIMESTAMPTZ,
    key_hint      TEXT,
    next_seq      BIGINT      NOT NULL DEFAULT 1,
    created_by    BIGINT      NOT NULL REFERENCES accounts (id),
    created_at    TIMESTAMPTZ NOT NULL,
    closed_at     TIMESTAMPTZ,
    CHECK ((key_hash IS NULL) = (key_role IS NULL) AND (key_hash IS NULL) = (key_issued_at IS NULL)),
    CHECK (status = 'open' OR key_hash IS NULL)
);
CREATE UNIQUE INDEX threads_key ON threads (key_hash) WHERE key_hash IS NOT NULL;

-- An ended membership is a deleted row; what it ended is recorded on the
-- receipts and assignments it touched.
CREATE TABLE thread_members (
    thread_id           BIGINT      NOT NULL REFERENCES threads (id),
    account_id          BIGINT      NOT NULL REFERENCES accounts (id),
    role                TEXT        NOT NULL CHECK (role IN ('governor', 'speaker', 'observer')),
    joined_via_key_hash BYTEA,
    joined_at           TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (thread_id, account_id)
);
CREATE INDEX thread_members_account ON thread_members (account_id, thread_id);

CREATE TABLE thread_entries (
    id         BIGSERIAL PRIMARY KEY,
    thread_id  BIGINT      NOT NULL REFERENCES threads (id),
    seq        BIGINT      NOT NULL,
    author_id  BIGINT      NOT NULL REFERENCES accounts (id),
    memory_id  BIGINT      NOT NULL REFERENCES memories (id),
    revision   INT         NOT NULL,
    summary    TEXT        NOT NULL DEFAULT '',
    reply_to   BIGINT REFERENCES thread_entries (id),
    created_at TIMESTAMPTZ NOT NULL,
    UNIQUE (thread_id, seq),
    FOREIGN KEY (memory_id, revision) REFERENCES memory_revisions (memory_id, revision)
);
CREATE TRIGGER thread_entries_immutable BEFORE UPDATE OR DELETE ON thread_entries
    FOR EACH ROW EXECUTE FUNCTION refuse_change();

-- One receipt per asked member and entry. A receipt is pending until it
-- ends, and its resolution says how.
CREATE TABLE thread_receipts (
    id         BIGSERIAL PRIMARY KEY,
    thread_id  BIGINT      NOT NULL REFERENCES threads (id),
    entry_id   BIGINT      NOT NULL REFERENCES thread_entries (id),
    account_id BIGINT      NOT NULL REFERENCES accounts (id),
    state      TEXT        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'fulfilled', 'withdrawn')),
    resolution TEXT CHECK (resolution IN ('reply', 'handle', 'take', 'retract', 'leave', 'remove', 'role_change', 'close')),
    note       TEXT,
    created_at TIMESTAMPTZ NOT NULL,
    ended_at   TIMESTAMPTZ,
    UNIQUE (entry_id, account_id),
    CHECK ((state = 'pending') = (resolution IS NULL)),
    CHECK ((state = 'pending') = (ended_at IS NULL)),
    CHECK (state <> 'fulfilled' OR resolution IN ('reply', 'handle', 'take')),
    CHECK (state <> 'withdrawn' OR resolution IN ('retract', 'leave', 'remove', 'role_change', 'close'))
);
CREATE INDEX thread_receipts_turn ON thread_receipts (account_id, created_at, id) WHERE state = 'pending';
CREATE INDEX thread_receipts_thread ON thread_receipts (thread_id, account_id) WHERE state = 'pending';

-- Assignments ride an entry. Every state after 'delivered' is terminal, and
-- ended_at is set exactly when the state is terminal.
CREATE TABLE assigns (
    id                 BIGSERIAL PRIMARY KEY,
    thread_id          BIGINT      NOT NULL REFERENCES threads (id),
    entry_id           BIGINT      NOT NULL UNIQUE REFERENCES thread_entries (id),
    creator_id         BIGINT      NOT NULL REFERENCES accounts (id),
    assignee_id        BIGINT      NOT NULL REFERENCES accounts (id),
    requirements       TEXT        NOT NULL,
    output_schema      JSONB,
    deliver_due_s      INT         NOT NULL CHECK (deliver_due_s BETWEEN 60 AND 604800),
    judge_due_s        INT         NOT NULL CHECK (judge_due_s BETWEEN 60 AND 604800),
    state              TEXT        NOT NULL DEFAULT 'open' CHECK (state IN
                       ('open', 'taken', 'delivered', 'adopted', 'rejected', 'undecided', 'dropped', 'timed_out', 'voided')),
    created_at         TIMESTAMPTZ NOT NULL,
    taken_at           TIMESTAMPTZ,
    deliver_due_at     TIMESTAMPTZ,
    delivered_at       TIMESTAMPTZ,
    judge_due_at       TIMESTAMPTZ,
    ended_at           TIMESTAMPTZ,
    end_cause          TEXT,
    payload            JSONB,
    memories           JSONB,
    verdict            TEXT CHECK (verdict IN ('adopt', 'reject')),
    reason             TEXT,
    judge_forfeited_at TIMESTAMPTZ,
    CHECK ((state IN ('open', 'taken', 'delivered')) = (ended_at IS NULL)),
    CHECK ((taken_at IS NULL) = (deliver_due_at IS NULL)),
    CHECK ((delivered_at IS NULL) = (judge_due_at IS NULL)),
    CHECK (state NOT IN ('adopted', 'rejected') OR verdict IS NOT NULL)
);
CREATE INDEX assigns_thread ON assigns (thread_id, id);
CREATE INDEX assigns_deliver ON assigns (assignee_id, taken_at, id) WHERE state = 'taken';
CREATE INDEX assigns_judge ON assigns (creator_id, delivered_at, id) WHERE state = 'delivered';
CREATE INDEX assigns_open ON assigns (assignee_id) WHERE state = 'open';
CREATE INDEX assigns_due ON assigns (deliver_due_at) WHERE state = 'taken';
CREATE INDEX assigns_judge_due ON assigns (judge_due_at) WHERE state = 'delivered';

-- The first successful result of a keyed room write, replayed verbatim for
-- the same request and refused for a different one.
CREATE TABLE thread_idempotency (
    account_id   BIGINT      NOT NULL REFERENCES accounts (id),
    tool         TEXT        NOT NULL,
    key          TEXT        NOT NULL,
    request_hash BYTEA       NOT NULL,
    -- json, not jsonb: a replay must be the first result byte for byte.
    snapshot     JSON        NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (account_id, tool, key)
);

-- +goose Down
DROP TABLE thread_idempotency;
DROP TABLE assigns;
DROP TABLE thread_receipts;
DROP TABLE thread_entries;
DROP TABLE thread_members;
DROP TABLE threads;
