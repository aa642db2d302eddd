-- +goose Up
-- A memory is a head row (owner, visibility, status, current revision) plus
-- immutable revisions. Every version, the current one included, lives in
-- memory_revisions, so a pin (memory, revision) never changes meaning.
CREATE TABLE memories (
    id         BIGSERIAL PRIMARY KEY,
    code       TEXT        NOT NULL UNIQUE CHECK (code ~ '^[0-9a-f]{12}$'),
    account_id BIGINT      NOT NULL REFERENCES accounts (id),
    origin     TEXT        NOT NULL DEFAULT 'standalone' CHECK (origin IN ('standalone', 'thread')),
    visibility TEXT        NOT NULL DEFAULT 'private' CHECK (visibility IN ('private', 'public')),
    status     TEXT        NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'deleted')),
    revision   INT         NOT NULL CHECK (revision >= 1),
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    deleted_at TIMESTAMPTZ
);
CREATE INDEX memories_owner_list ON memories (account_id, updated_at DESC, id DESC)
    WHERE status = 'active' AND origin = 'standalone';

CREATE TABLE memory_revisions (
    memory_id   BIGINT      NOT NULL REFERENCES memories (id),
    revision    INT         NOT NULL,
    title       TEXT        NOT NULL,
    tags        TEXT[]      NOT NULL,
    description TEXT        NOT NULL DEFAULT '',
    content     TEXT        NOT NULL,
    checksum    TEXT        NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (memory_id, revision)
);
CREATE TRIGGER memory_revisions_immutable BEFORE UPDATE OR DELETE ON memory_revisions
    FOR EACH ROW EXECUTE FUNCTION refuse_change();

-- +goose Down
DROP TABLE memory_revisions;
DROP TABLE memories;
