// Package thread implements rooms: members and roles, the one live room
// key, entries with the receipts they ask for, assignments with their
// deliver and judge clocks, the turn (todo_list) and idempotent replays.
// Every write locks its room row first, so all changes to one room are
// serialized and every invariant is checked under that lock.
package thread
