//! The filter's logging: the `log` crate's sink writes through the host's `log` call, and the panic hook logs at
//! critical level, both without unwrapping.

use super::*;
use proxy_wasm::types::LogLevel;

/// The `log` crate's sink: `proxy_log`, errors ignored (there is nowhere else to report them).
pub(super) struct Logger;

pub(super) static LOGGER: Logger = Logger;

impl log::Log for Logger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = match record.level() {
            log::Level::Trace => LogLevel::Trace,
            log::Level::Debug => LogLevel::Debug,
            log::Level::Info => LogLevel::Info,
            log::Level::Warn => LogLevel::Warn,
            log::Level::Error => LogLevel::Error,
        };
        let _ = host().log(level, &record.args().to_string());
    }

    fn flush(&self) {}
}

/// Installs the logger at `level`, and a panic hook that logs at critical level without unwrapping. Once per VM.
pub fn init_logging(level: log::LevelFilter) {
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
    // Native tests keep the default hook's report too, or a failed assertion would only reach the host's log.
    #[cfg(test)]
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let _ = host().log(
            LogLevel::Critical,
            &format!("llmroute: panic, this worker's VM is lost: {info}"),
        );
        #[cfg(test)]
        previous(info);
    }));
}
