// Package guard holds only tests that keep the tree's shape: every package says what
// it is for, and the bcd binary never pulls in control-plane or SQLite code.
package guard
