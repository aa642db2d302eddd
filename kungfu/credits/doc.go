// Package credits is the only writer of account balances. Every movement
// locks the account row, changes the balance and appends one ledger row with
// the balance after it, inside the caller's transaction, so a fact and its
// money commit or roll back together.
package credits
