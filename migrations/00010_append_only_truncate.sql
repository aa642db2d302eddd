-- +goose Up
-- The append-only tables refused UPDATE and DELETE row by row, but a
-- TRUNCATE (of the table, or cascading from one it references) fires no
-- row trigger and emptied them. A statement trigger closes that door too.
CREATE TRIGGER ledger_no_truncate BEFORE TRUNCATE ON ledger
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_change();
CREATE TRIGGER memory_revisions_no_truncate BEFORE TRUNCATE ON memory_revisions
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_change();
CREATE TRIGGER thread_entries_no_truncate BEFORE TRUNCATE ON thread_entries
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_change();
CREATE TRIGGER task_versions_no_truncate BEFORE TRUNCATE ON task_versions
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_change();
CREATE TRIGGER submission_events_no_truncate BEFORE TRUNCATE ON submission_events
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_change();
CREATE TRIGGER kz_audit_no_truncate BEFORE TRUNCATE ON kz_audit
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_change();

-- Unfinished letters per sender and per recipient are counted at every
-- send (the queue bound); these keep the count to the letters in flight.
CREATE INDEX kz_letters_from_open ON kz_letters (from_account) WHERE finished_at IS NULL;
CREATE INDEX kz_letters_to_open ON kz_letters (to_account) WHERE finished_at IS NULL;

-- +goose Down
DROP INDEX kz_letters_to_open;
DROP INDEX kz_letters_from_open;
DROP TRIGGER kz_audit_no_truncate ON kz_audit;
DROP TRIGGER submission_events_no_truncate ON submission_events;
DROP TRIGGER task_versions_no_truncate ON task_versions;
DROP TRIGGER thread_entries_no_truncate ON thread_entries;
DROP TRIGGER memory_revisions_no_truncate ON memory_revisions;
DROP TRIGGER ledger_no_truncate ON ledger;
