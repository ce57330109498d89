//! `config.json`, read as transformers writes it (version 4's `rope_theta` and `rope_scaling`,
//! or version 5's `rope_parameters`).

use std::path::Path;

use serde_json::{Map, Value as Json};

use crate::ConvertError;

/// A model's `config.json`.
pub struct Config {
    file: String,
    json: Map<String, Json>,
}

/// A JSON file, read whole (configuration files are small).
pub fn read_json(path: &Path) -> Result<Json, ConvertError> {
    let bytes = std::fs::read(path).map_err(|source| ConvertError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|e| ConvertError::Config {
        file: path.display().to_string(),
        reason: format!("not JSON: {e}"),
    })
}

impl Config {
    pub fn read(path: &Path) -> Result<Self, ConvertError> {
        let file = path.display().to_string();
        match read_json(path)? {
            Json::Object(json) => Ok(Config { file, json }),
            _ => Err(ConvertError::Config {
                file,
                reason: "not a JSON object".into(),
            }),
        }
    }

    pub fn error(&self, reason: String) -> ConvertError {
        ConvertError::Config {
            file: self.file.clone(),
            reason,
        }
    }

    pub fn get(&self, key: &str) -> Option<&Json> {
        self.json.get(key).filter(|v| !v.is_null())
    }

    /// The first of `keys` that the configuration holds, read by `read` (`what` it is, for
    /// the error where it is not).
    fn first<T>(
        &self,
        keys: &[&str],
        what: &str,
        read: fn(&Json) -> Option<T>,
    ) -> Result<Option<T>, ConvertError> {
        let Some((key, value)) = keys.iter().find_map(|k| self.get(k).map(|v| (k, v))) else {
            return Ok(None);
        };
        read(value)
            .map(Some)
            .ok_or_else(|| self.error(format!("{key} is not {what}: {value}")))
    }

    /// The first of `keys` that the configuration holds, as a whole number.
    pub fn uint(&self, keys: &[&str]) -> Result<Option<u64>, ConvertError> {
        self.first(keys, "a whole number", Json::as_u64)
    }

    /// Like [`Config::uint`], for a key the model cannot do without.
    pub fn required(&self, keys: &[&str]) -> Result<u64, ConvertError> {
        self.uint(keys)?
            .ok_or_else(|| self.error(format!("{} is missing", keys[0])))
    }

    /// The first of `keys` that the configuration holds, as a number.
    pub fn number(&self, keys: &[&str]) -> Result<Option<f64>, ConvertError> {
        self.first(keys, "a number", Json::as_f64)
    }

    /// The RoPE parameters: version 5's `rope_parameters`, else version 4's `rope_scaling`
    /// with `rope_theta` beside it.
    pub fn rope(&self) -> Rope<'_> {
        self.rope_of("full_attention")
    }

    /// The RoPE parameters of layers of type `layer_type` (`full_attention`,
    /// `sliding_attention`), where version 5 gives them per type (Gemma 3).
    pub fn rope_of(&self, layer_type: &str) -> Rope<'_> {
        let mut params = self
            .get("rope_parameters")
            .or_else(|| self.get("rope_scaling"))
            .and_then(Json::as_object);
        if let Some(by_type) = params
            .and_then(|p| p.get(layer_type))
            .and_then(Json::as_object)
        {
            params = Some(by_type);
        }
        Rope {
            config: self,
            params,
        }
    }

    /// The model's class names (`architectures`).
    pub fn architectures(&self) -> Vec<&str> {
        self.get("architectures")
            .and_then(Json::as_array)
            .map(|a| a.iter().filter_map(Json::as_str).collect())
            .unwrap_or_default()
    }
}

/// A model's RoPE parameters.
pub struct Rope<'a> {
    config: &'a Config,
    params: Option<&'a Map<String, Json>>,
}

impl Rope<'_> {
    /// The base frequency (`rope_theta`).
    pub fn theta(&self) -> Result<Option<f64>, ConvertError> {
        if let Some(theta) = self.number("rope_theta")? {
            return Ok(Some(theta));
        }
        self.config.number(&["rope_theta"])
    }

    /// The scaling's type (`rope_type`, or version 4's `type`); `None` for plain RoPE.
    pub fn kind(&self) -> Option<&str> {
        let params = self.params?;
        let kind = params
            .get("rope_type")
            .or_else(|| params.get("type"))
            .and_then(Json::as_str)?;
        (kind != "default").then_some(kind)
    }

    /// A number among the scaling's parameters.
    pub fn number(&self, key: &str) -> Result<Option<f64>, ConvertError> {
        let Some(value) = self
            .params
            .and_then(|p| p.get(key))
            .filter(|v| !v.is_null())
        else {
            return Ok(None);
        };
        value.as_f64().map(Some).ok_or_else(|| {
            self.config
                .error(format!("rope {key} is not a number: {value}"))
        })
    }

    /// A list of numbers among the scaling's parameters, which the scaling cannot do without.
    pub fn numbers(&self, key: &str) -> Result<Vec<f64>, ConvertError> {
        let not_numbers = || {
            self.config
                .error(format!("rope {key} is not a list of numbers"))
        };
        let Some(value) = self.params.and_then(|p| p.get(key)) else {
            return Err(self.config.error(format!("rope {key} is missing")));
        };
        value
            .as_array()
            .ok_or_else(not_numbers)?
            .iter()
            .map(|v| v.as_f64().ok_or_else(not_numbers))
            .collect()
    }

    /// Like [`Rope::number`], for a parameter the scaling cannot do without.
    pub fn required(&self, key: &str) -> Result<f64, ConvertError> {
        self.number(key)?
            .ok_or_else(|| self.config.error(format!("rope {key} is missing")))
    }
}
