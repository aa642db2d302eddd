// Package task implements public work contracts: publishers lock a budget
// behind a versioned contract judged by their own HTTP receiver; executors
// claim, submit and get paid. Money moves only through package credits, in
// the same transaction as the fact that moves it, and every task keeps
// budget_locked = settled + reserved + refunded + available.
package task
