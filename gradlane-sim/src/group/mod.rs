//! The group mode: N ranks run a program of collectives with the real
//! `ViewKeeper`s (and the `Agreement`s they start).

mod check;
mod plan;
mod world;

pub(crate) use check::check;
pub(crate) use plan::draw;
pub(crate) use world::run;
