//! The agreement mode: the survivors of a view that lost a rank agree on
//! the next with the real `Agreement` machines.

mod check;
mod plan;
mod world;

pub(crate) use check::check;
pub(crate) use plan::draw;
pub(crate) use world::run;
