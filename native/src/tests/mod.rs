//! The module's native tests: the hooks driven as Envoy drives them, over a fake Envoy (`fake_envoy`) that
//! defines every callback the module calls.

mod budget;
mod fake_envoy;
